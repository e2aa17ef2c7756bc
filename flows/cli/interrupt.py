"""Ctrl-C and SIGTERM end a run promptly, with everything it started, and say how to resume.

Kubernetes (and a shell's Ctrl-C) signal the `ctrpipe` process and wait a grace period.  The run has
started processes: a Dask cluster and, without PREFECT_API_URL, Prefect's temporary server in its own process
group; torchrun and its ranks in a session of their own (so that a timeout can stop the job), which the
launcher registers (`trainer.launch.lifetime.own_group`).  None of them may outlive it, and a rank must not
train on and commit beside the rerun.  Nothing else may be stopped: as PID 1 of a container (or a subreaper)
`ctrpipe` adopts every orphan of the container, and those are not the run's (`flows.node.procs.RunProcesses`).

`stop_on_signals` installs a handler for SIGINT and SIGTERM.  On the first signal a watcher thread
(woken through a pipe that the signal itself writes to, `signal.set_wakeup_fd`, so it wakes even while
Prefect's own SIGTERM handler is installed during a flow run) does, in order:

1. SIGTERM to every process the run started (`RunProcesses`, read with psutil), but Prefect's temporary
   server; SIGKILL after `GRACE_S` to what is left; the ones that are its children are reaped;
2. waits up to `UNWIND_S` for the main thread, which the handler interrupted (`Interrupted`), to unwind:
   Prefect marks the flow run crashed, the Dask client closes;
3. stops what is left the same way (the temporary server, anything started meanwhile), prints one line
   (what was interrupted, how to resume) and exits with `ExitCode.INTERRUPTED`, whatever the main
   thread is doing.

Every write of a run commits atomically, so a run stopped anywhere leaves its last committed state and
the rerun resumes from it (its stage lines say what it reused).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psutil

from flows.cli.exit_codes import ExitCode
from flows.node import procs as node_procs
from flows.node.procs import Proc, RunProcesses, descendants
from trainer.launch.lifetime import own_groups

__all__ = ["GRACE_S", "UNWIND_S", "Interrupted", "descendants", "stop", "stop_on_signals"]

GRACE_S = 3.0
"""How long a process gets to exit after SIGTERM before SIGKILL."""
UNWIND_S = 3.0
"""How long the main thread gets to report the interruption (to Prefect) once the job is stopped."""
_POLL_S = 0.05
_PREFECT_SERVER = "prefect.server.api.server:create_app"
"""In the command line of Prefect's temporary server (`prefect.server.api.server.SubprocessASGIServer`)."""
_SIGNAL_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class Interrupted(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt, not an error
    """Raised in the main thread by the first SIGINT/SIGTERM: unwinds the run as an interruption, not a failure
    (no `failed` day record is written)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:  # as Prefect's crash line shows it
        return f"interrupted by {_SIGNAL_NAMES.get(self.signum, self.signum)}"


def stop(procs: list[Proc], grace_s: float = GRACE_S) -> None:
    """SIGTERM each of `procs`, then SIGKILL those still alive after `grace_s`; returns when all are gone, those
    that were this process's children reaped (no zombie is left where no init reaps them)."""
    live = [q for p in procs if (q := _same(p)) is not None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for q in live:
            with suppress(psutil.Error):  # gone (psutil checks that the pid is still this process's)
                q.send_signal(sig)
        deadline = time.monotonic() + grace_s
        while (live := [q for q in live if not _gone(q)]) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if not live:
            return


def _same(p: Proc) -> psutil.Process | None:
    """`p` as a psutil handle, None when it is gone or its pid is another process's now."""
    try:
        q = psutil.Process(p.pid)
        return q if q.create_time() == p.started else None
    except psutil.Error:
        return None


def _gone(q: psutil.Process) -> bool:
    """`q` has exited; reaped when it is a zombie child of this process."""
    try:
        if not q.is_running():  # gone, or its pid is another process's now
            return True
        if q.status() != psutil.STATUS_ZOMBIE:
            return False
        if q.ppid() == os.getpid():
            os.waitpid(q.pid, os.WNOHANG)
    except (psutil.NoSuchProcess, ChildProcessError):  # gone, or reaped meanwhile by whoever started it
        pass
    return True


class _Watcher:
    def __init__(self, command: str, what: Callable[[], str], resume: str) -> None:
        self.command, self.what, self.resume = command, what, resume
        self.run = RunProcesses.begin()  # what is below this process already is not the run's
        self.unwound = threading.Event()
        self.fired = threading.Event()
        self.signum: int | None = None
        self.groups: frozenset[int] = frozenset()
        """The run's own process groups at the first signal: the main thread, interrupted, leaves `own_group`
        blocks (which forget theirs) while the watcher stops them."""
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd needs it; the watcher blocks on the read end
        self.thread = threading.Thread(target=self._watch, name="ctrpipe-signals", daemon=True)

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self.read_fd, 16)
            except OSError:
                return  # closed: the command ended without a signal
            signums = [b for b in data if b in _SIGNAL_NAMES]
            if signums:
                break
            if not data:
                return
        self.fired.set()
        signum = self.signum or signums[0]
        what = self.what()  # before the job stops: the stage it was in
        job = self.run.now(self.groups | own_groups())
        stop([p for p in job if _PREFECT_SERVER not in node_procs.command(p.pid)])
        self.unwound.wait(UNWIND_S)
        rest = self.run.now(self.groups | own_groups())
        stop(rest)
        started = len({p.pid for p in job} | {p.pid for p in rest})
        print(
            f"ctrpipe {self.command}: interrupted by {_SIGNAL_NAMES[signum]} during {what}; stopped the "
            f"{started} process(es) it had started. What had committed is kept: run `{self.resume}` again "
            "to resume",
            file=sys.stderr,
            flush=True,
        )
        os._exit(ExitCode.INTERRUPTED)

    def handler(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        if first:
            self.signum, self.groups = signum, own_groups()
        with suppress(BlockingIOError):  # the pipe is full of earlier signals: the watcher has its news
            os.write(self.write_fd, bytes([signum]))
        if first:
            raise Interrupted(signum)


@contextmanager
def stop_on_signals(command: str, what: Callable[[], str], resume: str) -> Iterator[None]:
    """For the block, SIGINT and SIGTERM stop the run as the module docstring says (main thread only; elsewhere
    the block runs unguarded).  After a signal the block never returns: the watcher ends the process.

    Args:
        command: the `ctrpipe` command, for the message.
        what: says what the run is doing (called once, at the signal).
        resume: the command line that resumes the run.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watcher = _Watcher(command, what, resume)
    watcher.thread.start()
    previous = {sig: signal.signal(sig, watcher.handler) for sig in _SIGNAL_NAMES}
    old_wakeup = signal.set_wakeup_fd(watcher.write_fd, warn_on_full_buffer=False)
    try:
        yield
    finally:
        if watcher.signum is not None or watcher.fired.is_set():
            watcher.unwound.set()
            watcher.thread.join()  # it exits the process
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(watcher.write_fd)  # the watcher's read returns b"": it ends
        watcher.thread.join(timeout=5)
        os.close(watcher.read_fd)
