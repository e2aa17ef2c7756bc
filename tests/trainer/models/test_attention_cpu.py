"""The CPU attention kernel is the plain formulation: values, gradients, dropout draws and FLOPs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from trainer.models import attention_cpu
from trainer.models.attention_cpu import attend
from trainer.models.ctr_model import plain_attention


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 4 examples: the batches below span several blocks and end in a partial one."""
    monkeypatch.setattr(attention_cpu, "BLOCK", 4)


def projected(batch: int, tokens: int = 7, dim: int = 8) -> torch.Tensor:
    return torch.randn(batch, tokens, 3 * dim, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("batch", [1, 4, 11])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_values_and_gradients_are_the_plain_formulations(heads: int, batch: int) -> None:
    torch.manual_seed(0)
    qkv = projected(batch)
    mine, plain = attend(qkv, heads, 0.0), plain_attention(qkv, heads, 0.0)
    torch.testing.assert_close(mine, plain, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(mine)
    (mine_g,) = torch.autograd.grad(mine, qkv, g)
    (plain_g,) = torch.autograd.grad(plain, qkv, g)
    torch.testing.assert_close(mine_g, plain_g, rtol=1e-12, atol=1e-12)


def test_the_backward_passes_gradcheck() -> None:
    torch.manual_seed(0)
    assert torch.autograd.gradcheck(lambda qkv: attend(qkv, 2, 0.0), (projected(5, tokens=3, dim=4),))


def assert_seeded_dropout_is_the_plain_formulations(qkv: torch.Tensor, heads: int, tol: float) -> None:
    """`attend` with dropout 0.5 under a seed: the values and gradients of the plain formulation under the same seed
    (F.dropout's own draw over the whole (B, H, T, T) weights); another seed, another mask."""
    g = torch.randn(*qkv.shape[:2], qkv.shape[2] // 3, dtype=qkv.dtype)
    torch.manual_seed(1)
    mine = attend(qkv, heads, 0.5)
    (mine_g,) = torch.autograd.grad(mine, qkv, g)
    torch.manual_seed(1)
    plain = plain_attention(qkv, heads, 0.5)
    (plain_g,) = torch.autograd.grad(plain, qkv, g)
    torch.testing.assert_close(mine, plain, rtol=tol, atol=tol)
    torch.testing.assert_close(mine_g, plain_g, rtol=tol, atol=tol)
    torch.manual_seed(2)
    assert not torch.allclose(attend(qkv, heads, 0.5), mine)


def test_a_seeded_dropout_drops_what_the_plain_formulation_drops() -> None:
    """The mask is F.dropout's own draw over the whole (B, H, T, T) weights: a seeded run keeps its masks."""
    torch.manual_seed(0)
    assert_seeded_dropout_is_the_plain_formulations(projected(9), 2, tol=1e-12)


def test_it_counts_the_flops_of_the_plain_formulation() -> None:
    """MFU divides counted FLOPs by time: the kernel's products are the same six per (example, head)."""

    def flops(f: Callable[[torch.Tensor, int, float], torch.Tensor]) -> int:
        qkv = projected(11).float().detach().requires_grad_()
        with attention_cpu.torch_ops_kernel(), FlopCounterMode(display=False) as counter:  # not the compiled one
            f(qkv, 2, 0.0).sum().backward()
        return int(counter.get_total_flops())

    assert flops(attend) == flops(plain_attention) > 0


def test_it_runs_for_a_training_step_on_a_cpu_in_fp32_only() -> None:
    """Eval, no-grad scoring, bf16 autocast (and CUDA, by the same check) keep the plain formulation."""
    qkv = torch.randn(2, 3, 24)
    assert attention_cpu.in_use(qkv, training=True)
    assert not attention_cpu.in_use(qkv, training=False)
    with torch.no_grad():
        assert not attention_cpu.in_use(qkv, training=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        projected_bf16 = torch.nn.functional.linear(torch.randn(2, 3, 8), torch.randn(24, 8))
    assert not attention_cpu.in_use(projected_bf16, training=True)
    with attention_cpu.plain_formulation():
        assert not attention_cpu.in_use(qkv, training=True)
    assert attention_cpu.in_use(qkv, training=True)  # restored on leaving
