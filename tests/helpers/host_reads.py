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
from torch.overrides import TorchFunctionMode

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


READS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "cpu",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "nonzero",
        "masked_select",
        "unique",
        "repeat_interleave",
    }
)
"""What `HostReadMode` counts: a value or a shape that depends on the data reaches Python (on CUDA a wait
for the GPU); and indexing with a boolean mask (`__getitem__`/`__setitem__`), whose shape does too."""


def _bool_index(args: tuple) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class HostReadMode(TorchFunctionMode):
    """Count the host reads made under it, by (path relative to the repo, function, op), from the innermost
    frame of the project's `packages` (a read inside torch or NumPy is charged to the project line that
    called it).  A `TorchFunctionMode` sees every torch call and `Tensor` method, so nothing is patched.

    Example::

        with HostReadMode() as reads:
            train_step(...)
        assert not reads.seen
    """

    def __init__(self, packages: tuple[str, ...] = PACKAGES) -> None:
        super().__init__()
        self.roots = tuple(str(REPO / p) + "/" for p in packages)
        self.seen: Counter[tuple[str, str, str]] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        name = getattr(func, "__name__", "")
        if name in READS or (name in ("__getitem__", "__setitem__") and _bool_index(args)):
            frame = sys._getframe(1)
            while frame is not None and not frame.f_code.co_filename.startswith(self.roots):
                frame = frame.f_back
            if frame is not None:
                path = str(Path(frame.f_code.co_filename).relative_to(REPO))
                self.seen[(path, frame.f_code.co_name, "[mask]" if name.endswith("item__") else name)] += 1
        return func(*args, **(kwargs or {}))

    def take(self) -> Counter[tuple[str, str, str]]:
        """The reads counted since the last `take`, and start counting afresh."""
        seen, self.seen = self.seen, Counter()
        return seen
