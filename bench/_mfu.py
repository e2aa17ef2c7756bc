"""Model FLOP utilisation for the benchmarks: FLOPs a training example costs, and the matmul rate one can attain.

    MFU = train FLOPs per example x examples/s / attainable FLOP/s

Both halves are measured, not assumed.  The FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode`
over one real forward and backward of the model (matmuls, attention and convolutions; elementwise work
counts 0, as in the usual MFU), so a change of architecture needs no formula updated.  The rate is that of
a plain fp32 matmul of the model's own largest layer at the benchmark's batch, timed in the same process
with the same torch threads: a CPU's peak on paper is not what one thread reaches on small shapes, and
the machine's load varies from run to run, so the ratio only means something when both come from one run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainer.models.attention_cpu import torch_ops_kernel


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs of the matmul-like ops `step()` runs (forward, and backward when it calls it).

    The attention runs its torch-ops kernel here: the compiled one's products are C loops the counter cannot see,
    and the FLOPs a step costs do not depend on which kernel does them."""
    with torch_ops_kernel(), FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def train_flops_per_example(model: nn.Module, *inputs: torch.Tensor) -> tuple[float, float]:
    """(forward, forward + backward) FLOPs per example of `model(*inputs)` (batch = first dim of inputs[0]).

    The backward also differentiates the floating-point inputs (embedding rows get their gradients, as in
    training); a sum of the output stands in for the loss (its FLOPs count 0 either way).
    """
    batch = inputs[0].shape[0]
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    forward = count_flops(lambda: model(*leaves))
    both = count_flops(lambda: model(*leaves).sum().backward())
    model.zero_grad(set_to_none=True)
    return forward / batch, both / batch


def largest_linear(model: nn.Module) -> tuple[int, int]:
    """(in_features, out_features) of the model's widest `nn.Linear` (by weight size): its dominant matmul shape."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear to take a matmul shape from; pass the shape")
    widest = max(linears, key=lambda m: m.in_features * m.out_features)
    return widest.in_features, widest.out_features


def matmul_flops_per_s(m: int, k: int, n: int, *, seconds: float = 0.3, repeats: int = 5) -> float:
    """Attainable fp32 FLOP/s of (m x k) @ (k x n) on this process's torch threads: the best of `repeats`
    timed runs of about `seconds` / `repeats` each (the best, since load on a shared machine only slows it)."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = torch.empty(m, n)
    torch.mm(a, b, out=out)  # warm-up: allocation, thread pool
    t0 = time.perf_counter()
    torch.mm(a, b, out=out)
    per = max(time.perf_counter() - t0, 1e-7)
    iters = max(1, int(seconds / repeats / per))
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            torch.mm(a, b, out=out)
        rates.append(2.0 * m * k * n * iters / (time.perf_counter() - t0))
    return max(rates)


def model_mfu(model: nn.Module, *inputs: torch.Tensor, seconds: float = 0.3) -> dict[str, float]:
    """FLOPs per example of `model` at `inputs`' batch and the attainable rate on its widest layer's shape.

    Returns `flops_per_example` (forward + backward), `forward_flops_per_example`, `attainable_gflops` and
    `matmul_shape` (m x k x n timed); `mfu(examples_per_s, ...)` turns a throughput into MFU.
    """
    forward, both = train_flops_per_example(model, *inputs)
    k, n = largest_linear(model)
    m = inputs[0].shape[0]
    rate = matmul_flops_per_s(m, k, n, seconds=seconds)
    return {
        "flops_per_example": both,
        "forward_flops_per_example": forward,
        "attainable_gflops": rate / 1e9,
        "matmul_shape": f"{m}x{k}x{n}",
    }


def mfu(examples_per_s: float, flops_per_example: float, attainable_gflops: float) -> float:
    """Share of the attainable matmul rate a training loop's examples/s amounts to."""
    return examples_per_s * flops_per_example / (attainable_gflops * 1e9)
