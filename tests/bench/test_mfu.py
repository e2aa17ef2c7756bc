"""bench._mfu: FLOPs per training example counted from the model, the attainable matmul rate, MFU."""

from __future__ import annotations

import math

import torch
from torch import nn

from bench._mfu import (
    largest_linear,
    matmul_flops_per_s,
    mfu,
    model_mfu,
    train_flops_per_example,
)


def stack() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_a_linear_stack_costs_2_flops_per_weight_forward_and_3x_that_with_its_backward() -> None:
    forward, both = train_flops_per_example(stack(), torch.randn(32, 8))
    assert forward == 2 * (8 * 16 + 16 * 4)  # a multiply and an add per weight and example; bias and ReLU count 0
    assert both == 3 * forward  # backward: the input's gradient and the weight's, one matmul each per layer


def test_a_two_input_model_counts_per_example_and_leaves_no_gradients_behind() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(3, 5), nn.Linear(7, 5)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.a(x) * self.b(y.flatten(1))

    model = Two()
    forward, both = train_flops_per_example(model, torch.randn(10, 3), torch.randn(10, 7, 1))
    assert forward == 2 * (3 * 5 + 7 * 5) and both == 3 * forward
    assert all(p.grad is None for p in model.parameters())


def test_the_rate_is_timed_on_the_widest_layer_at_the_batch() -> None:
    assert largest_linear(stack()) == (8, 16)
    res = model_mfu(stack(), torch.randn(64, 8), seconds=0.05)
    assert res["matmul_shape"] == "64x8x16"
    assert res["flops_per_example"] == 3 * res["forward_flops_per_example"] > 0
    assert math.isfinite(res["attainable_gflops"]) and res["attainable_gflops"] > 0
    assert matmul_flops_per_s(32, 32, 32, seconds=0.02, repeats=2) > 0


def test_mfu_is_achieved_over_attainable_flops() -> None:
    assert mfu(1_000.0, 3e6, 6.0) == 0.5  # 1,000 examples/s x 3 MFLOP = 3 GFLOP/s of 6 attainable
