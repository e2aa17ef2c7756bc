"""Copies between the host and the training device: `host_to_device` (queued like a kernel from pinned memory) and
`is_host`, the one test of whether a device is the host's memory."""

from __future__ import annotations

import torch

HOST = torch.device("cpu")
"""The host's memory: where the key indexes, the host tier and the reader's batches live."""


def is_host(device: torch.device | str) -> bool:
    """Whether `device` is the host's memory (`cpu`), where NumPy reads a tensor for free.

    Code that places a tensor asks this, never `device.type == "cpu"`: a CPU device with an index (`cpu:0`)
    is how `tests/helpers/host_reads.py` runs a CUDA rank's placements on a CPU, and it must take the device
    arm of every branch, as `cuda:0` does.
    """
    return torch.device(device) == HOST


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
