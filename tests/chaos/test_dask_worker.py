"""A Dask worker of a real `dask scheduler` + `dask worker` cluster SIGKILLed mid-ingest: the day completes with
the same rows (Dask reruns the lost tasks on the other worker), or fails with a clear error and nothing committed."""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from distributed import Client

from flows.config import load_config
from tests.helpers.chaos import DATE, VariantReport, rerun_problems, slot_wait
from tests.helpers.kill import run
from tests.helpers.procs import free_port, processes, start, wait_port
from tests.helpers.root_state import content

pytestmark = pytest.mark.chaos

BIN = Path(sys.executable).parent
SMALL_BLOCKS = {"ingest": {"block_size": 64 << 10}}
"""About 40 ingest tasks for the 2.4 MB sample, so that a kill lands among them."""


def _kill_a_busy_worker(address: str, events_done: Path, timeout: float) -> str | None:
    """SIGKILL (with its nanny) the first worker seen running a task before the day's events are committed."""
    with Client(address, timeout=30) as client:
        pids = client.run(os.getpid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not events_done.exists():
            if busy := [w for w, keys in client.processing().items() if keys]:
                os.killpg(os.getpgid(pids[busy[0]]), signal.SIGKILL)
                return busy[0]
            time.sleep(0.02)
    return None


def test_a_worker_killed_mid_ingest_costs_nothing(single_day, reports):
    ws, ref = single_day
    port = free_port()
    with processes() as procs:
        scheduler = start(
            procs,
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            ws.base / "dask-scheduler.log",
        )
        wait_port(port, scheduler)
        address = f"tcp://127.0.0.1:{port}"
        for i in range(2):
            start(
                procs,
                [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--no-dashboard", "--memory-limit", "2GiB"],
                ws.base / f"dask-worker-{i}.log",
            )
        with Client(address, timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
        cfg = ws.config("dask-worker", dask={"address": address}, **SMALL_BLOCKS)
        layout = load_config(cfg).layout()
        with ThreadPoolExecutor(1) as pool:
            day = pool.submit(
                run,
                ["run", "--date", DATE, "--config", str(cfg)],
                ws.env,
                ws.base / "dask-worker.log",
                timeout=3 * ref.run.seconds + 120,
            )
            killed = _kill_a_busy_worker(address, Path(layout.events(DATE)) / "_SUCCESS.json", timeout=300)
            result = day.result()
    assert killed, "no worker was seen running an ingest task"
    if result.rc == 0:
        problems = rerun_problems(ref, result, layout, [DATE])
        outcome = "completed"
    else:  # allowed: a clear error, and nothing of the day committed
        problems = (
            []
            if "error" in result.text() and content(layout, layout.events(DATE))[1] == "not committed"
            else [f"failed ({result.rc}) and left committed events"]
        )
        outcome = "failed cleanly"
    reports.setdefault("dask worker killed mid-ingest", VariantReport()).add(
        f"ingest ({outcome})", not problems, slot_wait(layout, [DATE])
    )
    print(f"\ndask worker {killed} killed mid-ingest: the day {outcome}: {problems or 'ok'}")
    assert not problems, f"logs in {ws.base}"
