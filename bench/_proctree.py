"""CPU time and peak memory of a process and all its descendants, by kind, sampled with psutil (peak RSS: Linux).

A daily run is several kinds of process: the driver (the CLI), its Dask workers, the torchrun
agent and its ranks, Prefect's ephemeral API server.  `ProcessTree` samples them in a thread:
each sample reads every descendant's CPU seconds (utime + stime, `flows.node.procs`) and peak RSS (VmHWM, the
kernel's own high-water mark, so a peak between two samples is not missed), with the wall clock
of the sample, so CPU seconds can be attributed to the stage that was running
(`cpu_between`).  What a process does after its last sample is lost (at most one interval).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from flows.node.procs import command, descendants, processes

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
        every = processes()
        tree = ([every[self.root]] if self.root in every else []) + descendants(self.root, every)
        for p in tree:
            key = (p.pid, p.started)
            proc = self.procs.get(key)
            if proc is None:
                proc = self.procs[key] = _Proc(kind_of(command(p.pid), is_root=p.pid == self.root))
            elif proc.kind == "other":  # first seen between fork and exec, with its parent's command line
                proc.kind = kind_of(command(p.pid), is_root=False)
            proc.samples.append((now, p.cpu_s))
            proc.peak_rss = max(proc.peak_rss, _peak_rss(p.pid))

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


def _peak_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
