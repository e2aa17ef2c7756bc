"""`host_to_device`: the one copy of a tensor to the training device, queued like a kernel from pinned memory."""

from __future__ import annotations

import torch


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device`; a host tensor bound for CUDA goes through pinned memory with `non_blocking`.

    A copy from pageable memory makes the host wait for the GPU's queue to drain; from pinned
    memory it is queued like a kernel, so index and batch uploads do not stall the step.  The
    pinned staging buffer comes from torch's caching host allocator, which keeps it until the copy ran.
    """
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
