"""`host_to_device`: no copy for a tensor already where it goes."""

from __future__ import annotations

import torch

from storage.embedding.rows.transfer import host_to_device


def test_host_to_device_leaves_a_cpu_tensor_alone() -> None:
    t = torch.arange(4)
    assert host_to_device(t, "cpu") is t
