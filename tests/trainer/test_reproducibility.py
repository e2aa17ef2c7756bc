"""Determinism on demand: the switch turns deterministic algorithms on; the RNG state a checkpoint carries."""

from __future__ import annotations

import pytest
import torch

from trainer.reproducibility import TorchRNG, apply_determinism


def test_deterministic_turns_on_deterministic_algorithms_and_off_changes_nothing() -> None:
    before = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        apply_determinism(False)
        assert not torch.are_deterministic_algorithms_enabled()
        apply_determinism(True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(before)


def test_deterministic_on_cuda_needs_the_cublas_workspace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with pytest.raises(RuntimeError, match="CUBLAS_WORKSPACE_CONFIG=:4096:8"):
        apply_determinism(True)


def test_the_rng_state_replays_the_same_draws_and_names_what_is_missing() -> None:
    rng = TorchRNG("cpu")
    state = rng.state_dict()
    assert set(state) == {"cpu"}, "a CPU rank has no CUDA generator to save"
    first = torch.rand(3)
    rng.load_state_dict(state)
    assert torch.equal(torch.rand(3), first)
    with pytest.raises(ValueError, match="cuda"):
        TorchRNG("cuda").load_state_dict(state)  # a CUDA rank must get its device generator back
