"""The processes of this node (psutil): who started whom, since when, how much CPU; and which of them a run started.

Two readers walk a run's processes: `flows.cli.interrupt` (stop what a run started, and nothing else) and
`bench._proctree` (CPU and memory of a day by kind of process).

What a run started (`RunProcesses`) is not every process below it.  A process that is PID 1 of a container, or
a child subreaper, adopts every orphan of the container: a `kubectl exec` shell's background job, a daemon a
debugging session left.  Those are in process groups of their own, so a run's processes are told by their group:
those below the run in the run's own process group that were not there when it began, and those of the groups
its launchers started outside it and registered (`trainer.launch.lifetime.own_group`: torchrun's session).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Proc:
    """A process as psutil shows it; `started` (its creation time) tells it from a later one with its pid."""

    pid: int
    ppid: int
    started: float
    state: str
    """`psutil.STATUS_*`: "running", "sleeping", "zombie", ..."""
    cpu_s: float
    """User + system CPU seconds so far."""


def _proc(p: psutil.Process) -> Proc | None:
    try:
        with p.oneshot():
            cpu = p.cpu_times()
            return Proc(p.pid, p.ppid(), p.create_time(), p.status(), cpu.user + cpu.system)
    except psutil.Error:  # gone, or not ours to read
        return None


def read_proc(pid: int) -> Proc | None:
    """`pid` as it is now, or None when it is gone."""
    try:
        return _proc(psutil.Process(pid))
    except psutil.Error:
        return None


def command(pid: int) -> str:
    """`pid`'s command line, its arguments joined by spaces ("" when it is gone)."""
    try:
        return " ".join(psutil.Process(pid).cmdline()).strip()
    except psutil.Error:
        return ""


def processes() -> dict[int, Proc]:
    """Every process of the node, by pid."""
    return {p.pid: p for q in psutil.process_iter() if (p := _proc(q))}


def descendants(pid: int, procs: dict[int, Proc] | None = None) -> list[Proc]:
    """Every live process below `pid` (children, theirs, ...), whatever their session or process group;
    zombies are walked through but not returned.  `procs`: a `processes()` already read."""
    children: dict[int, list[Proc]] = {}
    for p in (processes() if procs is None else procs).values():
        children.setdefault(p.ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.state != psutil.STATUS_ZOMBIE:
                out.append(child)
            todo.append(child.pid)
    return out


def alive(p: Proc) -> bool:
    """`p` still runs: its pid is not gone, reused or a zombie."""
    now = read_proc(p.pid)
    return now is not None and now.started == p.started and now.state != psutil.STATUS_ZOMBIE


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone
        return None


@dataclass(frozen=True)
class RunProcesses:
    """What a run started, told from whatever else this process has below it (the module docstring).

    `begin()` where the run begins, in the process that runs it; `now(groups)` lists them.
    """

    root: int
    group: int
    """The run's own process group (its children inherit it)."""
    before: frozenset[tuple[int, float]]
    """(pid, started) of the processes below the root when the run began: not the run's."""

    @classmethod
    def begin(cls) -> RunProcesses:
        me = os.getpid()
        return cls(me, os.getpgrp(), frozenset((p.pid, p.started) for p in descendants(me)))

    def now(self, groups: Iterable[int] = ()) -> list[Proc]:
        """The run's live processes: those below the root in its process group started since `begin`, and every
        process of `groups` (groups the run started outside its own, wherever their members are now)."""
        every = processes()
        out = {
            p.pid: p
            for p in descendants(self.root, every)
            if (p.pid, p.started) not in self.before and _group(p.pid) == self.group
        }
        if wanted := set(groups) - {self.group}:
            out |= {
                p.pid: p
                for p in every.values()
                if p.pid != self.root and p.state != psutil.STATUS_ZOMBIE and _group(p.pid) in wanted
            }
        return list(out.values())
