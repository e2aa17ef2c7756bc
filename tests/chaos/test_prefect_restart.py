"""The Prefect server SIGKILLed and started again in the middle of a deployment run (`ctrpipe deploy`, a process
worker): the run either finishes or is marked crashed, and running the deployment again completes without any
manual cleanup, within the stated bound of a dead holder's slot."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flows.config import load_config
from flows.prefect.slot import DEAD_HOLDER_BOUND_S
from tests.helpers.chaos import DATE, VariantReport, rerun_problems, slot_wait
from tests.helpers.procs import PrefectServer, processes, start

pytestmark = pytest.mark.chaos

BIN = Path(sys.executable).parent
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _deployment_run(env: dict, log: Path) -> str:
    out = subprocess.run(
        [str(BIN / "prefect"), "deployment", "run", "daily-retrain/ctr-on-demand", "--param", f"date={DATE}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log.write_text(out.stdout + out.stderr)
    m = re.search(r"UUID: ([0-9a-f-]{36})", out.stdout)
    assert out.returncode == 0 and m, out.stdout + out.stderr
    return m.group(1)


def _state(api: str, run_id: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{api}/flow_runs/{run_id}", timeout=5) as r:  # noqa: S310 - the test's server
            return json.load(r)["state"]["type"]
    except OSError:
        return None  # the server is down


def _wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(0.5)


def test_a_server_restart_mid_run_needs_no_cleanup(single_day, reports):
    ws, ref = single_day
    cfg = ws.config("prefect-restart")
    layout = load_config(cfg).layout()
    with processes() as procs:
        server = PrefectServer(procs, ws.base, ws.base / "prefect-server-home")
        server.start()
        out = subprocess.run(
            [str(BIN / "ctrpipe"), "deploy", "--pool", "ctr-process", "--config", str(cfg), "--no-alerts"],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        start(
            procs,
            [str(BIN / "prefect"), "worker", "start", "--pool", "ctr-process", "--type", "process"],
            ws.base / "prefect-worker.log",
            env=server.env,
        )

        first = _deployment_run(server.env, ws.base / "prefect-run-1.log")
        holder = Path(layout.slot_holder())
        _wait_until(holder.exists, 600, "the run taking the model's slot")  # in the middle: warm .. publish
        server.kill()
        time.sleep(3)
        server.start()
        _wait_until(lambda: _state(server.api, first) in TERMINAL, 900, f"flow run {first} ending")
        outcome = _state(server.api, first)

        second = _deployment_run(server.env, ws.base / "prefect-run-2.log")
        _wait_until(lambda: _state(server.api, second) in TERMINAL, 900, f"flow run {second} ending")
        assert _state(server.api, second) == "COMPLETED", (ws.base / "prefect-worker.log").read_text()[-3000:]
        problems = rerun_problems(
            ref, _Finished(ws.base / "prefect-worker.log"), layout, [DATE], max_wait_s=DEAD_HOLDER_BOUND_S
        )
    reports.setdefault("prefect server restarted", VariantReport()).add(
        f"model stages (run {outcome.lower()})", not problems, slot_wait(layout, [DATE])
    )
    print(f"\nprefect server restarted mid-run: the run ended {outcome}; the second run completed: {problems or 'ok'}")
    assert not problems, f"logs in {ws.base}"


class _Finished:
    """A finished run as `rerun_problems` reads it: exit status 0 and its log."""

    rc = 0

    def __init__(self, log: Path) -> None:
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace")
