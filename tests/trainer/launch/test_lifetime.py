"""A training job ends with the process that started it: the launcher's child gets a signal when the
launcher dies, and a rank whose parent is gone exits."""

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

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and reparenting are Linux's"),
    pytest.mark.subprocess,  # launchers and children, killed
]


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    try:
        psutil.Process(pid).wait(timeout=timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.TimeoutExpired:
        return False
    return True


def _pid_from(path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.05)
    raise TimeoutError(f"no pid in {path}")


def test_a_child_started_with_die_with_parent_is_signalled_when_its_launcher_is_killed(tmp_path: Path) -> None:
    # the launcher starts a long sleeper in a session of its own (as trainer.launch.torchrun starts torchrun),
    # then waits
    pid_file = tmp_path / "child.pid"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import subprocess, sys
        from trainer.launch.lifetime import die_with_parent
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                             preexec_fn=die_with_parent())
        open({str(pid_file)!r}, "w").write(str(p.pid))
        p.wait()
    """),
        ],
        start_new_session=True,
    )
    child = _pid_from(pid_file)
    assert psutil.pid_exists(child) and os.getpgid(child) != os.getpgid(launcher.pid)  # not in the killed group
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=30)
    assert _wait_gone(child), "the child outlived its launcher"


def test_without_the_guard_the_child_outlives_its_launcher(tmp_path: Path) -> None:
    # the control: what the guard prevents does happen without it
    pid_file = tmp_path / "child.pid"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(p.pid))
        p.wait()
    """),
        ],
        start_new_session=True,
    )
    child = _pid_from(pid_file)
    os.killpg(launcher.pid, signal.SIGKILL)
    launcher.wait(timeout=30)
    try:
        assert not _wait_gone(child, timeout=2.0)
    finally:
        psutil.Process(child).kill()


def _rank_of_a_parent(tmp_path: Path, poll_s: float) -> tuple[subprocess.Popen, int]:
    """A parent (its own session) whose child, a stand-in rank, watches it every `poll_s`: (parent, rank pid)."""
    pid_file = tmp_path / "rank.pid"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import subprocess, sys, time
        p = subprocess.Popen([sys.executable, "-c", "from trainer.launch.lifetime import exit_when_orphaned; "
                              "exit_when_orphaned(poll_s={poll_s}); import time; time.sleep(300)"],
                             start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(p.pid))
        time.sleep(300)
    """),
        ],
        start_new_session=True,
    )
    return parent, _pid_from(pid_file)


def test_a_rank_whose_parent_dies_exits_on_its_own(tmp_path: Path) -> None:
    parent, rank = _rank_of_a_parent(tmp_path, poll_s=0.1)
    time.sleep(0.5)  # the rank's watch is running
    assert psutil.pid_exists(rank)
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    assert _wait_gone(rank), "the rank kept running without its parent"


def test_a_rank_whose_parent_dies_is_ended_by_the_kernel_without_waiting_for_its_watch(tmp_path: Path) -> None:
    parent, rank = _rank_of_a_parent(tmp_path, poll_s=300)
    time.sleep(1.0)  # the rank has made its call
    assert psutil.pid_exists(rank)
    os.killpg(parent.pid, signal.SIGKILL)
    parent.wait(timeout=30)
    try:
        assert _wait_gone(rank, timeout=10.0), "the rank waited for its watch"  # PR_SET_PDEATHSIG, not the 300 s poll
    finally:
        if psutil.pid_exists(rank):
            psutil.Process(rank).kill()
