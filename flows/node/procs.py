"""The processes of this node as /proc shows them (Linux): who started whom, since when, how much CPU.

One reader for the two that walk a run's process tree: `flows.cli.interrupt` (stop everything a run
started, whatever its session) and `bench._proctree` (CPU and memory of a day by kind of process).
Elsewhere than Linux there is no /proc: `processes()` is empty.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""Clock ticks per second, the unit of /proc's CPU times and start times."""


@dataclass(frozen=True)
class Proc:
    """A process as /proc/<pid>/stat shows it; `started` (ticks since boot) tells it from a later one with its pid."""

    pid: int
    ppid: int
    started: int
    state: str
    cpu_s: float
    """User + system CPU seconds so far."""


def read_proc(pid: int) -> Proc | None:
    """`pid`'s stat line, or None when it is gone (or there is no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": the command name may hold spaces
    return Proc(pid, int(fields[1]), int(fields[19]), fields[0], (int(fields[11]) + int(fields[12])) / TICKS)


def command(pid: int) -> str:
    """`pid`'s command line, its arguments joined by spaces ("" when it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def processes() -> dict[int, Proc]:
    """Every process of the node, by pid."""
    if not os.path.isdir("/proc"):
        return {}
    return {p.pid: p for entry in os.listdir("/proc") if entry.isdigit() and (p := read_proc(int(entry)))}


def descendants(pid: int, procs: dict[int, Proc] | None = None) -> list[Proc]:
    """Every live process below `pid` (children, theirs, ...), whatever their session or process group;
    zombies are walked through but not returned.  `procs`: a `processes()` already read."""
    children: dict[int, list[Proc]] = {}
    for p in (processes() if procs is None else procs).values():
        children.setdefault(p.ppid, []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child.state != "Z":
                out.append(child)
            todo.append(child.pid)
    return out


def alive(p: Proc) -> bool:
    """`p` still runs: its pid is not gone, reused or a zombie."""
    now = read_proc(p.pid)
    return now is not None and now.started == p.started and now.state != "Z"
