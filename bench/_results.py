"""A benchmark's result file: its numbers, stamped with the commit, the machine and the date.

`bench/results/<name>.json` is committed: docs/benchmarks.md's tables are generated from these files
(`python -m bench._report`), so each stays small.  A writer's payload keeps its rows and the few numbers a
table shows; keys named in `RAW_KEYS` (per-seed and per-step detail) go beside it to `raw/<name>.json`, which
git ignores, and floats keep 6 significant digits.  A result transcribed from an earlier page rather than
measured says so in `source`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RAW_KEYS = frozenset({"raw"})
"""Payload keys that hold detail no table shows: written to `raw/<name>.json` beside the result, not into it."""
LIBRARIES = ("torch", "numpy", "pandas", "pyarrow", "dask")
TRANSCRIBED = "transcribed from"
"""How a result's `source` starts when its numbers were copied from a page, not measured by this checkout."""


def git_commit() -> str:
    """The checkout's commit (`git rev-parse HEAD`), with "-dirty" when code outside bench/results/ differs from it
    (the numbers then come from a tree no commit holds), or "unknown" outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head + "-dirty" if changed else head) if head else "unknown"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The machine a result was measured on."""
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
    }


def versions() -> dict[str, str]:
    """Python and the libraries whose versions move the numbers (read from their metadata, not imported)."""
    out = {"python": sys.version.split()[0]}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def command() -> str:
    """The command line that is running, as `python -m bench.<name> ...` for a benchmark."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    head = f"python -m bench.{script.stem}" if script.parent == REPO / "bench" else script.name
    return " ".join([head, *sys.argv[1:]])


def stamp() -> dict[str, Any]:
    """The commit, the date (UTC), the machine and the command, plus the library versions and the time
    (`environment`)."""
    now = time.gmtime()
    return {
        "command": command(),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d", now),
        "machine": machine(),
        "environment": {**versions(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", now)},
    }


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(k): _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def dumps(result: dict[str, Any]) -> str:
    """A result as its file holds it: sorted keys, one-space indents, floats of 6 significant digits."""
    return json.dumps(_rounded(result), indent=1, sort_keys=True, default=str) + "\n"


def write_result(folder: Path, name: str, payload: dict[str, Any]) -> Path:
    """Write the stamped `payload` to `folder/<name>.json` (its `RAW_KEYS` to `folder/raw/<name>.json`)."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = {k: v for k, v in payload.items() if k in RAW_KEYS}
    if raw:
        (folder / "raw").mkdir(exist_ok=True)
        (folder / "raw" / f"{name}.json").write_text(dumps(raw))
    path = folder / f"{name}.json"
    path.write_text(dumps({**stamp(), **{k: v for k, v in payload.items() if k not in RAW_KEYS}}))
    return path


def transcribed(result: dict[str, Any]) -> bool:
    """The result's numbers were copied from a page (`source`), so it holds only what that page gave."""
    return str(result.get("source", "")).startswith(TRANSCRIBED)
