"""CPU time and peak memory of a process and all its descendants, by kind, sampled from /proc (Linux).

A daily run is several kinds of process: the driver (the CLI), its Dask workers, the torchrun
agent and its ranks, Prefect's ephemeral API server.  `ProcessTree` samples them in a thread:
each sample reads every descendant's CPU seconds (utime + stime) and peak RSS (VmHWM, the
kernel's own high-water mark, so a peak between two samples is not missed), with the wall clock
of the sample, so CPU seconds can be attributed to the stage that was running
(`cpu_between`).  What a process does after its last sample is lost (at most one interval).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

TICKS = os.sysconf("SC_CLK_TCK")
KINDS = ("driver", "dask worker", "torchrun agent", "rank", "prefect server", "other")


def kind_of(cmdline: str, *, is_root: bool) -> str:
    """The kind of a process of a daily run, from its command line."""
    if is_root:
        return "driver"
    if "torch.distributed.run" in cmdline or "torchrun" in cmdline:  # before ranks: its argv names trainer.main
        return "torchrun agent"
    if "trainer.main" in cmdline:
        return "rank"
    if "prefect" in cmdline and ("server" in cmdline or "uvicorn" in cmdline):
        return "prefect server"
    if "multiprocessing" in cmdline and ("spawn_main" in cmdline or "forkserver" in cmdline):
        return "dask worker"  # LocalCluster workers are spawned; so are their resource trackers (little CPU)
    return "other"


@dataclass
class _Proc:
    kind: str
    peak_rss: int = 0
    samples: list[tuple[float, float]] = field(default_factory=list)
    """(wall time, cumulative CPU seconds)."""


class ProcessTree:
    """Sample the process `root` and its descendants every `interval_s` while the block runs.

    Usage::

        with ProcessTree(proc.pid) as tree:
            proc.wait()
        tree.peak_rss_by_kind()      # {kind: bytes}
        tree.cpu_between(t0, t1)     # CPU seconds of the whole tree in [t0, t1] (time.time())
    """

    def __init__(self, root: int, interval_s: float = 0.5) -> None:
        self.root, self.interval_s = root, interval_s
        self.procs: dict[tuple[int, int], _Proc] = {}  # (pid, start time): a pid can be reused
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="proctree", daemon=True)

    def __enter__(self) -> ProcessTree:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def sample(self) -> None:
        now = time.time()
        stats = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (st := _stat(int(name))) is not None:
                stats[int(name)] = st
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.root] if self.root in stats else []
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            _, cpu, start = stats[pid]
            key = (pid, start)
            proc = self.procs.get(key)
            if proc is None:
                proc = self.procs[key] = _Proc(kind_of(_cmdline(pid), is_root=pid == self.root))
            proc.samples.append((now, cpu))
            proc.peak_rss = max(proc.peak_rss, _peak_rss(pid))

    def peak_rss_by_kind(self) -> dict[str, int]:
        """The highest peak RSS of any one process of each kind seen."""
        out: dict[str, int] = {}
        for p in self.procs.values():
            out[p.kind] = max(out.get(p.kind, 0), p.peak_rss)
        return out

    def cpu_between(self, t0: float, t1: float) -> float:
        """CPU seconds the tree used in [t0, t1]: each interval between two samples of a process counts
        where its midpoint falls; a process's CPU before its first sample counts at that sample."""
        total = 0.0
        for p in self.procs.values():
            prev_t, prev_c = None, 0.0
            for t, c in p.samples:
                mid = t if prev_t is None else (prev_t + t) / 2
                if t0 <= mid < t1:
                    total += c - prev_c
                prev_t, prev_c = t, c
        return total


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, start time in ticks) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[19])


def _peak_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
