"""torch's threads set for a block and put back, even when the block raises; the process's cores."""

from __future__ import annotations

import os

import pytest
import torch

from trainer.threads import core_count, torch_threads


def test_the_threads_are_set_inside_the_block_and_put_back_after_it_even_on_an_error() -> None:
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        with torch_threads(2):
            assert torch.get_num_threads() == 2
        assert torch.get_num_threads() == 1
        with pytest.raises(RuntimeError, match="boom"), torch_threads(2):
            raise RuntimeError("boom")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)


def test_the_cores_are_the_processes_affinity() -> None:
    assert core_count() == len(os.sched_getaffinity(0)) >= 1
