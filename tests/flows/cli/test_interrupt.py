"""Ctrl-C and SIGTERM stop a command and every process it started, in one line (`flows.cli.interrupt`).

Real processes: a small program guarded by `stop_on_signals` starts a child in a session of its own (as the
trainer's torchrun is started) that ignores nothing, and one that ignores SIGTERM; the test signals the
program alone, as Kubernetes signals a pod's main process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from flows.cli.exit_codes import ExitCode
from flows.cli.interrupt import descendants, stop
from flows.node import procs
from tests.helpers.procs import REPO

PROGRAM = textwrap.dedent("""
    import subprocess, sys, time
    from flows.cli.interrupt import stop_on_signals
    with stop_on_signals("run", lambda: "2026-01-01 train", "ctrpipe run --date 2026-01-01"):
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        stubborn = subprocess.Popen([sys.executable, "-c",
                                     "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                     "print('READY', flush=True); time.sleep(300)"], stdout=sys.stdout)
        time.sleep(300)
""")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    log = tmp_path / "out.log"
    out = open(log, "wb")  # noqa: SIM115 - the child writes to it until the end of the test
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while "READY" not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return proc, psutil.Process(proc.pid).children(recursive=True)


@pytest.mark.subprocess
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_command_and_all_it_started_in_one_line(tmp_path, sig):
    proc, children = _start(tmp_path)
    assert len(children) == 2
    try:
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=30)
        gone, alive = psutil.wait_procs(children, timeout=5)
    finally:
        for p in [proc, *children]:
            if psutil.pid_exists(p.pid):
                os.kill(p.pid, signal.SIGKILL)
    text = (tmp_path / "out.log").read_text()
    assert code == ExitCode.INTERRUPTED, text
    assert alive == []  # the job in its own session and the child that ignores SIGTERM (SIGKILL after the grace)
    lines = [line for line in text.splitlines() if line != "READY"]
    name = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C (SIGINT)"
    assert lines == [
        f"ctrpipe run: interrupted by {name} during 2026-01-01 train; stopped the 2 process(es) it had "
        "started. What had committed is kept: run `ctrpipe run --date 2026-01-01` again to resume"
    ], text


def test_without_a_signal_the_block_runs_and_leaves_the_handlers_as_they_were():
    from flows.cli.interrupt import stop_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stop_on_signals("run", lambda: "x", "ctrpipe run"):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.subprocess
def test_descendants_are_found_across_sessions_and_stopped():
    outer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        time.sleep(300)
    """),
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        # until the child has run its command: between its fork and its exec it is there with an empty one
        while not ((found := descendants(outer.pid)) and "time.sleep(300)" in procs.command(found[0].pid)):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(found) == 1 and "time.sleep(300)" in procs.command(found[0].pid)
        stop(found, grace_s=5)
        assert not psutil.pid_exists(found[0].pid) or psutil.Process(found[0].pid).status() == psutil.STATUS_ZOMBIE
    finally:
        if outer.poll() is None:
            os.killpg(outer.pid, signal.SIGKILL)
