"""The learning-rate schedule and the embedding L2 gradient (pure functions)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from trainer.config import OptimConfig
from trainer.optim.schedule import embedding_l2_grad, lr_at, set_step_lrs


def test_lr_warmup_then_constant() -> None:
    got = [lr_at(s, base_lr=1.0, total_steps=10, warmup_steps=4) for s in range(1, 11)]
    assert got == pytest.approx([0.25, 0.5, 0.75, 1.0] + [1.0] * 6)


@pytest.mark.parametrize("decay", ["linear", "cosine"])
def test_lr_decay_reaches_min_ratio_monotonically(decay: str) -> None:
    got = [lr_at(s, base_lr=2.0, total_steps=20, warmup_steps=5, decay=decay, min_ratio=0.1) for s in range(1, 26)]
    assert got[4] == pytest.approx(2.0)  # end of warm-up
    assert got[19] == pytest.approx(0.2) and got[24] == pytest.approx(0.2)  # last step and beyond
    assert all(a >= b for a, b in zip(got[4:], got[5:], strict=False))
    mid = lr_at(12, base_lr=2.0, total_steps=20, warmup_steps=5, decay=decay, min_ratio=0.1)
    t = 7 / 15
    shape = 1 - t if decay == "linear" else 0.5 * (1 + math.cos(math.pi * t))
    assert mid == pytest.approx(2.0 * (0.1 + 0.9 * shape))


def test_lr_errors() -> None:
    with pytest.raises(ValueError, match="1-based"):
        lr_at(0, base_lr=1.0, total_steps=10)
    with pytest.raises(ValueError, match="decay must be"):
        lr_at(3, base_lr=1.0, total_steps=10, decay="step")
    with pytest.raises(ValueError, match="lr_decay"):
        OptimConfig(lr_decay="step")


def test_set_step_lrs_sets_dense_and_sparse() -> None:
    opt = SimpleNamespace(adam=SimpleNamespace(param_groups=[{"lr": 0.0}]))
    sparse = SimpleNamespace(lr=0.0)
    cfg = OptimConfig(lr=1e-3, sparse_lr=1e-2, warmup_steps=2, lr_decay="linear", min_lr_ratio=0.0)
    set_step_lrs(opt, sparse, cfg, step=1, total_steps=22)
    assert opt.adam.param_groups[0]["lr"] == pytest.approx(5e-4) and sparse.lr == pytest.approx(5e-3)
    set_step_lrs(opt, sparse, cfg, step=12, total_steps=22)
    assert opt.adam.param_groups[0]["lr"] == pytest.approx(5e-4) and sparse.lr == pytest.approx(5e-3)
    # a warm-up never outlasts the run: 100 steps asked, all 22 are warm-up (the recipe sizes it to the day)
    set_step_lrs(opt, sparse, dataclasses.replace(cfg, warmup_steps=100), step=11, total_steps=22)
    assert sparse.lr == pytest.approx(5e-3)
    scaled = SimpleNamespace(
        adam=SimpleNamespace(param_groups=[{"lr": 0.0, "lr_scale": 1.0}, {"lr": 0.0, "lr_scale": 0.5}])
    )
    set_step_lrs(scaled, sparse, cfg, step=1, total_steps=22)  # a group's lr_scale (optim.cross_lr_scale) is kept
    assert [g["lr"] for g in scaled.adam.param_groups] == [pytest.approx(5e-4), pytest.approx(2.5e-4)]
    untouched = SimpleNamespace(lr=0.123)
    set_step_lrs(opt, untouched, OptimConfig(warmup_steps=0, lr_decay="none"), step=1, total_steps=4)
    assert untouched.lr == 0.123


def test_embedding_l2_grad_is_the_gradient_of_the_penalty() -> None:
    torch.manual_seed(0)
    rows = torch.randn(4, 3, 2, requires_grad=True)
    l2 = 0.7
    penalty = 0.5 * l2 * rows.pow(2).sum(dim=(1, 2)).mean()
    penalty.backward()
    zero = torch.zeros(4, 3, 2)
    torch.testing.assert_close(embedding_l2_grad(rows, zero, l2), rows.grad)
    g = torch.randn(4, 3, 2)
    assert embedding_l2_grad(rows, g, 0.0) is g
