"""Count the host reads of device values a piece of code makes: `.item()`, `.tolist()`, `.cpu()`.

On CUDA each of them waits for the GPU.  On a CPU-only machine nothing waits, but the calls are the
same, so counting them where the project makes them (the caller's file and line) tells which ones a
CUDA step would pay for.  The project marks each intended one with a `# host read:` comment on the
line or the line before (trainer/train.py's docstring lists them).
"""

from __future__ import annotations

import contextlib
import linecache
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "storage")
METHODS = ("item", "tolist", "cpu")
MARK = "# host read:"


@contextlib.contextmanager
def host_reads(packages: tuple[str, ...] = PACKAGES) -> Iterator[Counter[tuple[str, int, str]]]:
    """Within the block, count each call of `METHODS` made from the project's `packages`, by
    (path relative to the repo, line, method)."""
    seen: Counter[tuple[str, int, str]] = Counter()
    roots = tuple(str(REPO / p) + "/" for p in packages)
    originals = {name: getattr(torch.Tensor, name) for name in METHODS}

    def wrap(name: str):
        original = originals[name]

        def counted(self, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(roots):
                seen[(str(Path(caller.f_code.co_filename).relative_to(REPO)), caller.f_lineno, name)] += 1
            return original(self, *args, **kwargs)

        return counted

    for name in METHODS:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def unmarked(seen: Counter[tuple[str, int, str]]) -> list[str]:
    """The call sites of `seen` without a `# host read:` comment on their line or the line before."""
    out = []
    for path, line, name in seen:
        text = linecache.getline(str(REPO / path), line) + linecache.getline(str(REPO / path), line - 1)
        if MARK not in text:
            out.append(f"{path}:{line} .{name}()")
    return out
