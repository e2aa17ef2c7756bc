"""A training job ends with the process that started it.

torchrun and its ranks run in sessions of their own (the launcher kills the whole job by its group on
a timeout), so a SIGKILL of the `ctrpipe` process group, an OOM kill or a lost node's supervisor would
leave them training: writing checkpoints and perhaps committing a candidate while the rerun trains the
same day.  Two guards, both Linux-only (elsewhere they do nothing):

- `die_with_parent` (a `preexec_fn` for torchrun): the kernel sends torchrun SIGTERM when the thread
  that started it dies; torchrun's handler then stops its ranks (SIGTERM, then SIGKILL).
- `exit_when_orphaned` (in each rank): the kernel SIGKILLs the rank when its parent (the torchrun agent)
  dies (PR_SET_PDEATHSIG), and a daemon thread that checks the parent every `ORPHAN_POLL_S` ends it too
  (where prctl is missing, or the agent died before the call), for a torchrun that was itself SIGKILLed
  and could not stop its ranks: a rank whose torchrun is gone exits within a second.

A run stops only what it started (`flows.cli.interrupt`): the processes of its own process group, and the
groups its launchers start outside it, which they register for their lifetime (`own_group`: torchrun's session).

Every commit of the job is atomic, so a job stopped at any point leaves the last committed state.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when the thread that created it exits."""
ORPHAN_POLL_S = 0.25
"""How often a rank checks that its torchrun agent is still its parent."""
_OWN_GROUPS: set[int] = set()


@contextmanager
def own_group(pgid: int) -> Iterator[None]:
    """For the block, process group `pgid` (a child started in a group or session of its own: its pid) is this
    process's: a signal that stops the run stops it too (`own_groups`).  Register it before anything can signal
    the run, and leave the block only once the child is reaped (until then no new group can take its number)."""
    _OWN_GROUPS.add(pgid)
    try:
        yield
    finally:
        _OWN_GROUPS.discard(pgid)


def own_groups() -> frozenset[int]:
    """The process groups outside its own that this process has started and not yet reaped (`own_group`)."""
    return frozenset(_OWN_GROUPS)


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    fn: Callable[..., int] = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    return fn


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `subprocess.Popen(preexec_fn=...)` that makes the child get `sig` when this process dies.

    Returns None where prctl is not available (not Linux).  The libc function is looked up here, in
    the parent, so the child only calls it.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before the call: the kernel will not tell us
            os.kill(os.getpid(), sig)

    return preexec


def exit_when_orphaned(*, poll_s: float = ORPHAN_POLL_S, code: int = 1) -> threading.Thread:
    """End this process once its parent process is gone: SIGKILL from the kernel at the parent's death (Linux),
    and a daemon thread that exits it (`os._exit(code)`) at the next check after.

    A parent that dies reparents its children (to init or a subreaper), so a changed `os.getppid()` is
    the sign.  Started by each rank right away, it checks every `poll_s` seconds.
    """
    parent = os.getppid()
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the agent died before this call: the thread below sees it

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(poll_s):
            if os.getppid() != parent:
                print(
                    f"rank {os.environ.get('RANK', '?')}: the torchrun agent (pid {parent}) is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(code)

    thread = threading.Thread(target=watch, name="exit-when-orphaned", daemon=True)
    thread.start()
    return thread
