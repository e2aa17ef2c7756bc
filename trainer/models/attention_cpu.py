"""Self-attention over a short token sequence, forward and backward laid out for a CPU's small matmuls.

The default model attends over its 26 field tokens with 8-wide heads (39 tokens, the dense bucket tokens too,
with `model.attention_input: tokens`): per (example, head) a Tx8 by 8xT product for the scores and a TxT by
Tx8 one for the weighted values, and their four backward products.  On one CPU thread MKL's batched matmul
runs the products whose output is 8 rows wide (8xT by TxT) much faster than the same FLOPs as TxT by Tx8, and
autograd's own backward of the plain formulation picks the slow form for three of the six.  So here each head's q, k
and v are held transposed, (N, head_dim, T), and the products and their backward are written out (one
`torch.autograd.Function`) in the forms that are fast: `attend(...)` is `F.dropout(softmax(q k^T / sqrt(d)), p) v` in
values and gradients, up to float rounding.  The batch goes through in blocks of `BLOCK` examples, so one block's (T x
T) weights stay in the core's L2 between its products, and the dropout mask is drawn once for the whole batch, with
the draw `F.dropout` makes, so a seeded run drops what it dropped before.

Where a C compiler builds it, `attend` runs the compiled kernel of `trainer.models.attention_native` instead (the
same values to float rounding, faster); this torch-ops kernel is its fallback.  Both are timed against the plain
formulation by `python -m bench.dense_step` (`docs/reports/2026-12-04-dense-step.md`).
`trainer.models.ctr_model.self_attention` calls this for a training forward on a CPU in fp32, and its plain matmuls
elsewhere (CUDA, bf16 autocast, eval, `torch.export`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from trainer.models import attention_native

__all__ = ["BLOCK", "KERNELS", "attend", "in_use", "plain_formulation", "ran", "torch_ops_kernel"]

BLOCK = 128
"""Examples per block: 128 x 2 heads x 39 x 39 fp32 weights are 0.8 MB, within a core's L2.  Timed against 64, 256
and one block per batch, 128 was the fastest with 39 tokens and as fast as any with the default's 26."""


_enabled = True
_native = True
KERNELS = ("compiled", "torch-ops", "plain")
"""The attention's kernels: `attention_native`'s compiled one, this module's torch-ops one, autograd's plain matmuls."""
ran: Counter[str] = Counter()
"""Training forwards of the attention since the process started, by kernel (`KERNELS`): `attend` counts its two,
`trainer.models.ctr_model.self_attention` the plain ones (CUDA, bf16); the Trainer records the day's
(`trainer.train.TrainStats.attention_forwards`, model.json `train.attention_kernel`)."""


def in_use(qkv: torch.Tensor, *, training: bool) -> bool:
    """Whether a forward of the projected tokens `qkv` runs `attend`: a training step with gradients, on a CPU,
    in fp32 (under bf16 autocast the projection comes out bf16), unless inside `plain_formulation()`."""
    return _enabled and training and torch.is_grad_enabled() and qkv.device.type == "cpu" and qkv.dtype == torch.float32


@contextmanager
def torch_ops_kernel() -> Iterator[None]:
    """Inside, `attend` runs its torch-ops kernel even where the compiled
    one builds (`bench.dense_step`'s comparison)."""
    global _native
    before, _native = _native, False
    try:
        yield
    finally:
        _native = before


@contextmanager
def plain_formulation() -> Iterator[None]:
    """Inside, every forward takes autograd's plain formulation: `bench.dense_step`'s baseline, in the same process."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


class _Attention(torch.autograd.Function):
    """softmax(q^T k / sqrt(d)) v per (example, head), transposed: qkvt (3, N, d, T) -> out^T (N, d, T).

    `keep` (N, T, T) is the dropout's scaled mask on the weights, or None.  Forward and backward go block by
    block (`block` of N at a time), every product in its 8-row-output form, into buffers allocated once: no
    per-block autograd nodes, and one gradient for q, k and v together (three slices' gradients would each
    be zero-filled to the whole and summed).
    """

    @staticmethod
    def forward(ctx: Any, qkvt: torch.Tensor, keep: torch.Tensor | None, block: int) -> torch.Tensor:
        _, n, d, t = qkvt.shape
        qt, kt, vt = qkvt[0] * d**-0.5, qkvt[1], qkvt[2]
        w = qkvt.new_empty(n, t, t)  # softmax weights, before dropout: what the backward needs
        out = qkvt.new_empty(n, d, t)
        for i in range(0, n, block):
            b = slice(i, i + block)
            wb = torch.softmax(torch.bmm(qt[b].transpose(1, 2), kt[b]), dim=-1, out=w[b])  # (b, Tq, Tk)
            torch.bmm(vt[b], (wb if keep is None else wb * keep[b]).transpose(1, 2), out=out[b])
        ctx.save_for_backward(qt, kt, vt, w, keep)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx: Any, go: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qt, kt, vt, w, keep = ctx.saved_tensors
        go = go.contiguous()
        g = qt.new_empty(3, *qt.shape)  # the gradients of q, k and v, as qkvt lays them out
        for i in range(0, qt.shape[0], ctx.block):
            b = slice(i, i + ctx.block)
            wb = w[b]
            torch.bmm(go[b], wb if keep is None else wb * keep[b], out=g[2, b])
            gw = torch.bmm(go[b].transpose(1, 2), vt[b])  # (b, Tq, Tk): the weights' gradient
            if keep is not None:
                gw.mul_(keep[b])
            gs = gw.sub_((gw * wb).sum(dim=-1, keepdim=True)).mul_(wb)  # the softmax's backward: the scores'
            torch.bmm(kt[b], gs.transpose(1, 2), out=g[0, b])
            torch.bmm(qt[b], gs, out=g[1, b])
        g[0].mul_(qt.shape[1] ** -0.5)  # through the queries' scaling
        return g, None, None


def attend(qkv: torch.Tensor, heads: int, dropout: float) -> torch.Tensor:
    """Multi-head attention of the projected tokens qkv (B, T, 3D) (q, k, v side by side, each D = heads x
    head_dim) -> (B, T, D) before the out-projection, with dropout `dropout` on the attention weights."""
    b, t, width = qkv.shape
    d = width // 3
    hd = d // heads
    keep = None
    if dropout > 0:  # F.dropout's own draw on the (B, H, T, T) weights: the same mask for the same seed
        keep = (
            qkv.new_zeros(b, heads, t, t)
            if dropout >= 1
            else qkv.new_empty(b, heads, t, t).bernoulli_(1 - dropout).div_(1 - dropout)
        )
    native = _native and qkv.dtype == torch.float32 and qkv.device.type == "cpu"
    lib = attention_native.kernel(t, heads, hd) if native else None
    ran["compiled" if lib is not None else "torch-ops"] += 1
    if lib is not None:  # the compiled kernel: the mask laid out (B, H, T_key, T_query), as it holds the weights
        keep_t = None if keep is None else keep.transpose(-1, -2).contiguous()
        return attention_native.NativeAttention.apply(qkv, keep_t, heads, lib)
    if keep is not None:
        keep = keep.view(b * heads, t, t)
    qkvt = qkv.view(b, t, 3, heads, hd).permute(2, 0, 3, 4, 1).reshape(3, b * heads, hd, t)
    out = _Attention.apply(qkvt, keep, BLOCK * heads)  # (B*H, hd, T)
    return out.view(b, heads, hd, t).permute(0, 3, 1, 2).reshape(b, t, d)
