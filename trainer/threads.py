"""How many cores a process has, and torch's intra-op threads set for a block and put back.

Three places change torch's threads for a while: the scoring pass (one per pool worker), the score server's
small batches (one), and rank 0's companion fit (every core, while the other ranks wait).  `torch_threads`
is the one way they do it, so none leaves the process with another count after an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def core_count() -> int:
    """Cores this process may run on (its CPU affinity, which a container's limit narrows)."""
    return len(os.sched_getaffinity(0))


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside the block, then back to what they were."""
    saved = torch.get_num_threads()
    if n == saved:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)
