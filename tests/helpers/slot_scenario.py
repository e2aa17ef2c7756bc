"""A SIGKILLed holder of a model's Prefect slot, and how long the session's server took to free it: run in the
background from the start of a test run, so that the minute it waits for the holder's lease overlaps other tests.

`tests/flows/prefect/test_slot.py` checks the outcome.  Its wait cannot be shorter: the server's shortest lease is 60 s
(`lease_duration` ge=60 in Prefect's API), and the dead holder's lease must expire for the bound to show.  Run in
the test, it left that test's worker idle, one of two cores, for that minute.

`begin` starts `python -m tests.helpers.slot_scenario <run dir>` once per test run (the first process that asks,
under a lock: both xdist workers collect the test); the scenario writes `OUTCOME` in the run's folder, which
`outcome` waits for.  `stop` kills what it left (the run's first process calls it at the end).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from contextlib import suppress
from pathlib import Path
from typing import Any

from tests.helpers.procs import exited, once, start

OUTCOME = "slot-scenario.json"
"""The scenario's result, in the run's folder: what the test checks."""
RECORD = "slot-scenario-pids"
"""The name of the run's record (`once`) of the process groups the scenario started (its own, the holder's)."""
FIXTURE = "killed_holder"
"""The fixture of the test that checks the outcome: a run whose tests use it starts the scenario."""


def begin(run_dir: Path) -> None:
    """Start the scenario in the background, unless this run has started it already (`once`)."""

    def make() -> dict[str, Any]:
        folder = run_dir / "slot-scenario"
        folder.mkdir(exist_ok=True)
        command = [sys.executable, "-m", "tests.helpers.slot_scenario", str(run_dir)]
        return {"scenario": start([], command, folder / "scenario.log").pid}

    once(run_dir, RECORD, "the slot scenario", make)


def outcome(run_dir: Path, timeout_s: float = 600) -> dict[str, Any]:
    """The scenario's outcome (`main`), once it has written it; `begin` first."""
    path, log, record = run_dir / OUTCOME, run_dir / "slot-scenario" / "scenario.log", run_dir / f"{RECORD}.json"
    if not record.exists():
        raise RuntimeError("the slot scenario was not begun: tests/conftest.py begins it when a collected test uses it")
    scenario = json.loads(record.read_text())["scenario"]
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if exited(scenario) and not path.exists():
            raise RuntimeError(f"the slot scenario (pid {scenario}) ended without an outcome:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the slot scenario wrote no outcome in {timeout_s:.0f} s:\n{_tail(log)}")
        time.sleep(0.5)
    result: dict[str, Any] = json.loads(path.read_text())
    if result.get("error"):
        raise RuntimeError(f"the slot scenario failed:\n{result['error']}\n{_tail(log)}")
    return result


def stop(run_dir: Path) -> None:
    """Kill the scenario and its holder, if a run ended before the scenario did.  A finished scenario (its outcome
    written) has stopped its holder itself, and its pids may be another process's by now: nothing is killed."""
    record = run_dir / f"{RECORD}.json"
    if (run_dir / OUTCOME).exists() or not record.exists():
        return
    for pgid in json.loads(record.read_text()).values():  # each started in its own process group (`start`)
        with suppress(FileNotFoundError, ProcessLookupError):
            if str(run_dir) in Path(f"/proc/{pgid}/cmdline").read_text():  # still one of the scenario's
                os.killpg(pgid, signal.SIGKILL)


def _tail(log: Path) -> str:
    return log.read_text()[-4000:] if log.exists() else f"(no {log})"


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main(run_dir: Path) -> None:
    """Hold the slot of a root of the scenario's own in another process, SIGKILL it, and take the slot: `OUTCOME`."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.prefect.slot import server_slot
    from storage.io.layout import Layout
    from tests.helpers.procs import processes, shared_server
    from tests.helpers.slots import hold_slot

    folder, result = run_dir / "slot-scenario", {}
    try:
        api = shared_server(run_dir)
        root = folder / "root"
        with processes() as procs:  # the holder is stopped on the way out, should the scenario fail before its kill
            holder = hold_slot(procs, "server", root, folder / "holder.log", env={"PREFECT_API_URL": api})
            record = run_dir / f"{RECORD}.json"
            record.write_text(json.dumps({**json.loads(record.read_text()), "holder": holder.pid}))
            killed = time.monotonic()
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
        log, messages = logging.getLogger("slot-scenario"), _Messages()
        log.addHandler(messages)
        log.setLevel(logging.INFO)
        layout = Layout(str(root), "ctr")
        with temporary_settings({PREFECT_API_URL: api}), server_slot(layout, 300, log=log, report_every_s=20) as taken:
            result["freed_s"] = time.monotonic() - killed
            result["waited_s"] = taken.waited_s
            result["node_lock"] = (root / "_local" / "ctr" / "slot.lock").read_text()
        result["holder_file_after"] = (root / "models" / "ctr" / "slot-holder.json").exists()
        result["holder"] = {"pid": holder.pid, "host": socket.gethostname()}
        result["waits"] = [m for m in messages.messages if "waiting for" in m]
    except Exception:  # noqa: BLE001 - the test that reads the outcome raises it, with the scenario's log
        result["error"] = traceback.format_exc()
    partial = run_dir / f"{OUTCOME}.partial"
    partial.write_text(json.dumps(result))
    partial.replace(run_dir / OUTCOME)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
