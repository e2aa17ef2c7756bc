"""Shared helpers for benchmarks: result tables, JSON output, peak memory, machine description.

A benchmark measures the project beside a baseline in the same process or run and
reports ratios; it never asserts on time (tests do not time anything).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the numbers were measured on (goes into every JSON result)."""
    import torch

    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except OSError:
        pass
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
        "date": time.strftime("%Y-%m-%d"),
    }


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb(pid: int | None = None) -> float:
    """Current resident memory of a process from /proc (no psutil needed)."""
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def timer() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["s"] = time.perf_counter() - t0


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A plain-text table of result rows (floats shown with 4 significant digits)."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def report(name: str, rows: Sequence[dict[str, Any]], *, params: dict[str, Any], notes: str = "",
           columns: Sequence[str] | None = None, out: str | Path | None = None) -> Path:
    """Print the table and write `bench/results/<name>.json` (or `out`) with params and machine."""
    print(f"\n== {name} ==")
    print(table(rows, columns))
    if notes:
        print(notes)
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": name, "params": params, "machine": machine(), "rows": list(rows),
                                "notes": notes}, indent=2, default=str))
    print(f"results: {path}")
    return path
