"""Ctrl-C and SIGTERM stop a command and every process it started, in one line (`flows.cli.interrupt`).

Real processes: a small program guarded by `stop_on_signals` starts a child in a session of its own, registered
as the trainer's torchrun is (`own_group`), that ignores nothing, and one that ignores SIGTERM; the test signals
the program alone, as Kubernetes signals a pod's main process.  Another program adopts orphans, as PID 1 of a
container does: those it did not start outlive its interruption.
"""

from __future__ import annotations

import contextlib
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
from flows.node.procs import RunProcesses
from tests.helpers.procs import REPO

PROGRAM = textwrap.dedent("""
    import subprocess, sys, time
    from flows.cli.interrupt import stop_on_signals
    from trainer.launch.lifetime import own_group
    with stop_on_signals("run", lambda: "2026-01-01 train", "ctrpipe run --date 2026-01-01"):
        job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        with own_group(job.pid):
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


ADOPTING = textwrap.dedent("""
    import ctypes, subprocess, sys, time
    from flows.cli.interrupt import stop_on_signals
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: adopt orphans, as PID 1 does
    def orphan(tag, **popen):
        # a process whose parent exits at once, so this one adopts it
        child = f"'import time; time.sleep(300)  # {tag}'"
        starter = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {child}])"
        subprocess.run([sys.executable, "-c", starter], check=True, **popen)
    orphan("TOKEN before")  # in this process group, before the run: a container entrypoint's background job
    with stop_on_signals("run", lambda: "2026-01-01 ingest", "ctrpipe run --date 2026-01-01"):
        orphan("TOKEN exec", start_new_session=True)  # as `kubectl exec` leaves one: a session of its own
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # TOKEN worker"])
        print("READY", flush=True)
        time.sleep(300)
""")


def _tagged(token: str, program: int) -> dict[str, psutil.Process]:
    """The sleepers the program started or adopted, by their tag."""
    out = {}
    for p in psutil.process_iter():
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if p.pid != program and argv[-1:] and argv[-1].startswith("import time") and f"# {token} " in argv[-1]:
            out[argv[-1].rsplit(" ", 1)[-1]] = p
    return out


@pytest.mark.subprocess
def test_an_interrupt_stops_the_runs_processes_and_spares_the_orphans_it_adopted(tmp_path):
    token = f"T{os.getpid()}x{time.monotonic_ns()}"
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", ADOPTING.replace("TOKEN", token)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            start_new_session=True,
        )
    tagged: dict[str, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 60
        while "READY" not in log.read_text() or len(tagged := _tagged(token, proc.pid)) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert {name: p.ppid() for name, p in tagged.items()} == dict.fromkeys(("before", "exec", "worker"), proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=30)
        gone, alive = psutil.wait_procs([tagged["worker"]], timeout=5)
        spared = {name for name in ("before", "exec") if tagged[name].is_running()}
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in tagged.values():
            with contextlib.suppress(psutil.Error):
                p.kill()
    text = log.read_text()
    assert code == ExitCode.INTERRUPTED, text
    assert alive == [] and spared == {"before", "exec"}, text  # the run's worker stopped, the adopted ones not
    assert "stopped the 1 process(es) it had started" in text, text


@pytest.mark.subprocess
def test_the_run_is_its_process_group_started_since_it_began_and_the_groups_it_registered():
    sleep = [sys.executable, "-c", "import time; time.sleep(300)"]
    earlier = subprocess.Popen(sleep)
    run = RunProcesses.begin()
    mine = subprocess.Popen(sleep)
    session = subprocess.Popen(sleep, start_new_session=True)
    try:
        assert {p.pid for p in run.now()} == {mine.pid}
        assert {p.pid for p in run.now([session.pid])} == {mine.pid, session.pid}
    finally:
        for p in (earlier, mine, session):
            p.kill()
            p.wait()


@pytest.mark.subprocess
def test_stop_reaps_the_children_it_stopped():
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]) for _ in range(2)]
    try:
        stop([p for k in kids if (p := procs.read_proc(k.pid))], grace_s=5)
        assert not any(psutil.pid_exists(k.pid) for k in kids)  # gone, not zombies waiting for a wait()
    finally:
        for k in kids:
            if k.poll() is None:
                k.kill()
