"""The CTR model: field embeddings -> self-attention over fields -> interaction -> MLP -> logit.

The embeddings are not parameters of this module: every rank pulls the rows of
its batch from the sharded embedding store (`trainer.distributed.sharded_embedding.ShardedEmbedding`)
and passes them in as a leaf tensor `emb` (B, F, D) whose gradient is pushed
back to the owners.  Only the dense part below is data-parallel.

    emb (B, F, D) -> SequenceAttention -> (B, F, D)          dense (B, n)
                                            |                  |  (only with model.dense_buckets > 0)
                                            |                  DenseArch (B, n_b, D)
                                            v                  v
                InteractionArch.blocks: dense (B, n), (B, F*D), (B, n_b*D) -> OverArch -> logits (B,)

The blocks are the MLP's input (B, n + F'*D), uncatted: its first layer takes each block by its own columns
(`trainer.models.layers.concat_linear`).

F' = F + n_b, where n_b = n with `model.dense_buckets > 0` (one learned bucket token per dense
feature) and 0 without.  The attention attends over the F field tokens, the bucket tokens joining them
after it; with `model.attention_input: tokens` it attends over all F' (the cat before it).  `model.wide`
adds a logistic-regression term to the logit, and `model.cross`
a DCN-V2 cross network's logit on the flattened field tokens (B, F*D), or on every token (B, F'*D) with
`model.cross_input: tokens` (`CrossTerm`).  `model.arch` other
than `attention` swaps the body for a reference architecture of `trainer.models.reference` (lr, dnn,
deepfm, dcn_v2) with the same signature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.models import attention_cpu
from trainer.models.config import ModelConfig
from trainer.models.layers import CrossTerm, OverArch, dense_linear
from trainer.models.reference import REFERENCE_ARCHS, dense_arch

__all__ = ["BIAS_SCALE", "CROSS_PREFIX", "CTRModel", "InteractionArch", "SequenceAttention"]

CROSS_PREFIX = "cross."
"""Names of the `model.cross` term's parameters start with this: the trainer steps them at
`optim.cross_lr_scale` times the dense learning rate."""
BIAS_SCALE = 20.0
"""The global bias enters the logit as BIAS_SCALE * b.  Adam moves b by about lr per step, so the
logit offset moves by ~BIAS_SCALE * lr (0.02 at lr 1e-3): it reaches the base rate's logit
(about -1.1 at a 25% click rate) within the warm-up instead of after ~1000 steps, and the per-key
weights no longer have to carry the intercept (which L2 then pulls back: a miscalibrated model)."""


class SequenceAttention(nn.Module):
    """Multi-head self-attention over the field embeddings of one example.

    Each layer is `x = LayerNorm(x + MHA(x, x, x))` (post-norm residual); the F
    fields play the role of a sequence with no order (no positional encoding:
    field identity is already in the key hash, hence in the embedding).

    Args:
        dim: embedding width D; must be divisible by `num_heads`.
        num_heads: attention heads.
        num_layers: stacked layers; 0 makes the module the identity.
        dropout: attention dropout probability.

    Example::

        att = SequenceAttention(dim=8, num_heads=2, num_layers=1)
        y = att(torch.randn(4, 3, 8))  # (B=4, F=3, D=8) -> (4, 3, 8)
    """

    def __init__(self, *, dim: int, num_heads: int, num_layers: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(
                f"embedding_dim ({dim}) must be divisible by model.num_heads ({num_heads}); "
                "change one of store.embedding_dim or model.num_heads"
            )
        self.attn = nn.ModuleList(
            nn.MultiheadAttention(dim, num_heads, dropout=dropout, batch_first=True) for _ in range(num_layers)
        )
        self.norm = nn.ModuleList(nn.LayerNorm(dim) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attn, norm in zip(self.attn, self.norm, strict=True):
            # nn.ModuleList is not generic: it yields Modules, and these are the MultiheadAttentions built above
            assert isinstance(attn, nn.MultiheadAttention)  # noqa: S101 - an invariant, for mypy
            x = norm(x + self_attention(attn, x))  # (B, F, D)
        return x


def self_attention(attn: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """`attn(x, x, x, need_weights=False)[0]` for batch-first x (B, F, D), in plain matmuls.

    The same parameters and arithmetic as `nn.MultiheadAttention` (its dropout on the attention
    weights included), computed the way a short sequence is cheap on a CPU: one projection GEMM
    and batched matmuls over (B, H), faster than torch's fused kernel on short sequences of 8-wide heads
    (`docs/reports/2026-12-04-dense-step.md`), and a saved model loads unchanged.  A training step on a CPU in fp32 runs
    `trainer.models.attention_cpu.attend`, whose backward takes the fast forms of the same products;
    anything else (CUDA, bf16 autocast, eval, `torch.export`) runs `plain_attention`.
    """
    qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)  # (B, F, 3D)
    if attention_cpu.in_use(qkv, training=attn.training):
        return attn.out_proj(attention_cpu.attend(qkv, attn.num_heads, attn.dropout))
    if attn.training:
        attention_cpu.ran["plain"] += 1
    return attn.out_proj(plain_attention(qkv, attn.num_heads, attn.dropout if attn.training else 0.0))


def plain_attention(qkv: torch.Tensor, heads: int, dropout: float) -> torch.Tensor:
    """Multi-head attention of projected tokens qkv (B, F, 3D) -> (B, F, D), `dropout` on the weights, by autograd."""
    b, f, width = qkv.shape
    d = width // 3
    q, k, v = qkv.view(b, f, 3, heads, d // heads).permute(2, 0, 3, 1, 4)  # each (B, H, F, D/H)
    weights = torch.matmul(q * (d // heads) ** -0.5, k.transpose(-1, -2)).softmax(dim=-1)  # (B, H, F, F)
    weights = F.dropout(weights, dropout, dropout > 0)
    return torch.matmul(weights, v).transpose(1, 2).reshape(b, f, d)  # (B, F, D)


class InteractionArch(nn.Module):
    """Joins the dense features and the attended field embeddings into one vector per example.

    Args:
        num_dense: n, the number of dense (already log1p-transformed) features.
        num_fields: F.
        dim: D.

    Example::

        inter = InteractionArch(num_dense=2, num_fields=3, dim=4)
        z = inter(torch.randn(5, 2), torch.randn(5, 3, 4))  # -> (5, 2 + 3*4)
    """

    def __init__(self, *, num_dense: int, num_fields: int, dim: int) -> None:
        super().__init__()
        self.out_dim = num_dense + num_fields * dim

    def forward(self, dense: torch.Tensor, fields: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.blocks(dense, fields), dim=1)  # (B, n + F*D)

    def blocks(self, dense: torch.Tensor, *tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The joined vector's column blocks, uncatted: dense (B, n) and each (B, F_i, D) of `tokens` flattened
        (B, F_i*D), the F_i summing to F.  `OverArch` takes them as they are (its first layer without their cat's
        gradient)."""
        return (dense, *(t.reshape(t.shape[0], -1) for t in tokens))


class CTRModel(nn.Module):
    """The dense part of the CTR model; embeddings come from the store.

    With `config.arch == "attention"` (the default) the sub-architectures are
    `dense_arch` (only with dense buckets), `attention`, `interaction`, `over`, `wide`
    (with `model.wide`: logit += wide_scale * sum_f e_f[0] + <a, dense>, a logistic-regression term)
    and `cross` (with `model.cross`: logit += CrossTerm(flattened tokens), zero until trained);
    any other arch is held as `net` (see `trainer.models.reference`).  Every arch adds the global
    bias `BIAS_SCALE * bias` to its logit.

    Args:
        config: architecture (arch, heads, attention layers, MLP widths, dropout, dense buckets).
        num_dense: n, dense features per example (already log-transformed).
        num_fields: F, categorical fields per example.
        dim: D, the embedding width (`StoreConfig.embedding_dim`).

    Example::

        model = CTRModel(ModelConfig(mlp_dims=(16,), dropout=0.0), num_dense=13, num_fields=26, dim=8)
        logits = model(torch.randn(32, 13), torch.randn(32, 26, 8))  # (32,)
        probs = torch.sigmoid(logits)
    """

    def __init__(self, config: ModelConfig, *, num_dense: int, num_fields: int, dim: int) -> None:
        super().__init__()
        if num_dense < 0 or num_fields < 1 or dim < 1:
            raise ValueError(
                f"CTRModel needs num_dense >= 0, num_fields >= 1, dim >= 1; got {num_dense}, {num_fields}, {dim}"
            )
        dropout = config.resolved().dropout  # refuses `auto`: derive the day's value first (trainer.plan.recipe)
        self.config = config
        self.num_dense, self.num_fields, self.dim = num_dense, num_fields, dim
        self.bias = nn.Parameter(torch.zeros(()))  # logit offset, scaled by BIAS_SCALE
        self.cross_skipped = False
        """The cross term's forward is skipped (`hold_cross`): it is held still and adds exactly 0."""
        if config.arch != "attention":
            self.net = REFERENCE_ARCHS[config.arch](config, num_dense=num_dense, num_fields=num_fields, dim=dim)
            return
        if config.dense_buckets:  # registered only when used: default checkpoints keep their keys
            self.dense_arch = dense_arch(config, num_dense=num_dense, dim=dim)
        tokens = num_fields + (num_dense if config.dense_buckets else 0)
        self.attention = SequenceAttention(
            dim=dim, num_heads=config.num_heads, num_layers=config.attention_layers, dropout=dropout
        )
        self.interaction = InteractionArch(num_dense=num_dense, num_fields=tokens, dim=dim)
        self.over = OverArch(in_dim=self.interaction.out_dim, mlp_dims=config.mlp_dims, dropout=dropout)
        if config.wide:  # first-order term: the row's e[0] is the key's weight, as in `lr`
            self.wide = dense_linear(num_dense)
        if config.cross:  # on a forked RNG: every other draw (initial values, dropout) is as without it
            with torch.random.fork_rng(devices=[]):
                crossed = tokens if config.cross_input == "tokens" else num_fields
                self.cross = CrossTerm(in_dim=crossed * dim, num_layers=config.cross_layers, rank=config.cross_rank)

    def hold_cross(self) -> bool:
        """Hold the cross term still for a day whose recipe does not train it (`optim.cross_lr_scale` 0).

        Its parameters stop requiring a gradient, so the backward computes no weight gradients for it
        (the rows still get the gradient through it: its output depends on them).  While its output
        layer is all zero (a term never trained) its output is exactly 0 and adds exactly 0 to every
        gradient, so its forward and backward are skipped altogether: the same logits and gradients
        without the term's FLOPs, most of the default model's.  Its parameters stay in the state dict,
        unchanged, for the day that trains it.  Returns whether the forward is skipped; without a cross term, False.
        Call it after the parameters are loaded (a warm start or a checkpoint): the check reads them once.
        """
        if not self.config.cross or self.config.arch != "attention":
            return False
        self.cross.requires_grad_(False)
        head = self.cross.head
        # host read: once per run, where the trainer builds the model (not in a step)
        self.cross_skipped = not bool(head.weight.any() or head.bias.any())
        return self.cross_skipped

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        return self._logits(dense, emb, with_wide=False)[0]

    def logits_and_wide(self, dense: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits (B,) and the wide term's own logit (B,): the wide term plus the bias, a logistic
        regression on the same key weights (`optim.wide_loss` trains it to predict alone too); None for a
        model without a wide term."""
        return self._logits(dense, emb, with_wide=True)

    def _logits(
        self, dense: torch.Tensor, emb: torch.Tensor, *, with_wide: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if dense.shape[1:] != (self.num_dense,) or emb.shape[1:] != (self.num_fields, self.dim):
            raise ValueError(
                f"CTRModel expects dense (B, {self.num_dense}) and emb (B, {self.num_fields}, {self.dim}), "
                f"got {tuple(dense.shape)} and {tuple(emb.shape)}"
            )
        if self.config.arch != "attention":
            return self.net(dense, emb) + BIAS_SCALE * self.bias, None  # (B,)
        b = emb.shape[0]
        buckets = self.dense_arch(dense) if self.config.dense_buckets else None  # (B, n, D)
        every = "tokens" in (self.config.attention_input, self.config.cross_input)
        tokens = emb if buckets is None or not every else torch.cat([emb, buckets], dim=1)  # (B, F', D): all the
        # tokens, cat only where the attention or the cross term takes them all
        if buckets is not None and self.config.attention_input == "fields":  # the bucket tokens join after it
            blocks = self.interaction.blocks(dense, self.attention(emb), buckets)
        else:
            blocks = self.interaction.blocks(dense, self.attention(tokens))
        logits = self.over(blocks) + BIAS_SCALE * self.bias  # (B,): blocks (B, n), (B, F*D)[, (B, n*D)], no cat
        if self.config.cross and not self.cross_skipped:
            crossed = tokens if self.config.cross_input == "tokens" else emb  # emb unsliced: a slice's backward
            # would zero-fill the whole (B, F', D) gradient and copy into it
            logits = logits + self.cross(crossed.reshape(b, -1))  # (B, F'*D or F*D) -> (B,)
        if not self.config.wide:
            return logits, None
        # the key and bucket weights e[0] summed, (B, F, D) -> (B,): summed before the select, whose backward
        # then zero-fills (B, D), not (B, F, D)
        w = emb.sum(dim=1)[:, 0]
        if buckets is not None:
            w = w + buckets.sum(dim=1)[:, 0]
        w = self.config.wide_scale * w
        wide_dense = self.wide(dense).squeeze(-1)  # (B,)
        wide = wide_dense + w + BIAS_SCALE * self.bias if with_wide else None
        return logits + wide_dense + w, wide  # (B,)
