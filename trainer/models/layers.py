"""Building blocks shared by the architectures of `trainer.models.ctr_model` and `trainer.models.reference`.

Notation (as in torchrec's DLRM): B batch size, n dense features, F categorical
fields, D embedding width, K dense buckets.
"""

from __future__ import annotations

import warnings
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


def dense_linear(num_dense: int) -> nn.Linear:
    """`nn.Linear(num_dense, 1)` with zero weights: the first-order term of the dense features.

    A log without dense fields (Avazu) has `num_dense == 0`; torch then warns that initializing the
    empty weight is a no-op, which it is.  The initial values, and the random draws, are those of
    `nn.Linear` either way.

    Example::

        wide = dense_linear(13)
        logit = wide(torch.randn(5, 13))  # (5, 13) -> (5, 1)
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
        linear = nn.Linear(num_dense, 1)
        nn.init.zeros_(linear.weight)
    return linear


class _ConcatLinear(torch.autograd.Function):
    """`F.linear(torch.cat(parts, 1), weight, bias)` whose backward gives each part its gradient from the part's own
    columns of the weight: (B, out) @ (out, w_i) per part, never a product with the whole (B, in) width, and none for a
    part that needs no gradient."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, bias: torch.Tensor, *parts: torch.Tensor) -> torch.Tensor:
        z = torch.cat(parts, dim=1)  # (B, in): what the weight's gradient needs
        ctx.save_for_backward(weight, z)
        ctx.widths = [p.shape[1] for p in parts]
        return torch.addmm(bias, z, weight.t())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weight, z = ctx.saved_tensors
        grads: list[torch.Tensor | None] = [
            g.t().mm(z) if ctx.needs_input_grad[0] else None,
            g.sum(0) if ctx.needs_input_grad[1] else None,
        ]
        start = 0
        for i, width in enumerate(ctx.widths):
            grads.append(g.mm(weight[:, start : start + width]) if ctx.needs_input_grad[2 + i] else None)
            start += width
        return tuple(grads)


def concat_linear(parts: tuple[torch.Tensor, ...], linear: nn.Linear) -> torch.Tensor:
    """`linear(torch.cat(parts, dim=1))` for 2-D parts (B, w_i) whose widths sum to `linear.in_features`.

    Why: the default model's MLP input is 13 dense values and 39 tokens of 16 (637 wide); MKL runs the input
    gradient's (B, 256) @ (256, 637) markedly slower than the (256, 624) product of the tokens' own columns, and
    the dense values need no gradient.  A forward with gradients on a CPU in fp32 runs `_ConcatLinear`; anything
    else (CUDA, bf16 autocast, no gradient wanted, `torch.export`, a layer without bias) the plain cat and linear.
    """
    x, bias = parts[0], linear.bias
    if (
        bias is not None
        and torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    ):
        return _ConcatLinear.apply(linear.weight, bias, *parts)
    return F.linear(torch.cat(parts, dim=1), linear.weight, linear.bias)


class OverArch(nn.Module):
    """MLP from an input vector to one logit per example.

    The input is one (B, in_dim) tensor, or a tuple of its column blocks, which the first layer takes without
    their cat's gradient (`concat_linear`).

    Args:
        in_dim: width of the input vector.
        mlp_dims: hidden widths, each followed by ReLU (and dropout when > 0).
        dropout: dropout probability after each hidden layer.

    Example::

        over = OverArch(in_dim=14, mlp_dims=(8, 4))
        logits = over(torch.randn(5, 14))  # (5, 14) -> (5,)
        over((torch.randn(5, 2), torch.randn(5, 12)))  # the same input as two blocks -> (5,)
    """

    def __init__(self, *, in_dim: int, mlp_dims: tuple[int, ...], dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_dim
        for hidden in mlp_dims:
            # Dropout(0) is the identity: kept, so the parameter names do not depend on the (per-day) dropout
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            return self.mlp(x).squeeze(-1)  # (B, in_dim) -> (B,)
        layers = iter(self.mlp)
        h = concat_linear(x, cast(nn.Linear, next(layers)))  # the blocks (B, w_i) -> (B, hidden)
        for layer in layers:
            h = layer(h)
        return h.squeeze(-1)


class DenseArch(nn.Module):
    """Optional bucketisation of the dense features into learned tokens, one per feature.

    The features arrive as d = log1p(max(x, 0)) with missing -> 0 (pipeline.encode.stage),
    so bucket 0 is "x <= 0 or missing"; buckets 1 .. K-2 split (0, max_value] evenly
    on the log scale and bucket K-1 is everything above.  Each (feature, bucket)
    has its own D-vector, a dense (data-parallel) parameter: n*K*D numbers, tiny.
    With K = 0 the module produces no tokens (B, n, D) -> (B, 0, D) and the
    architectures use the raw log values only.

    Args:
        num_dense: n.
        buckets: K; 0 disables bucketisation, otherwise K >= 3.
        max_value: the upper edge of the last closed bucket, on the log1p scale.
        dim: D.

    Example::

        arch = DenseArch(num_dense=2, buckets=4, max_value=3.0, dim=8)
        tokens = arch(torch.tensor([[0.0, 0.7], [2.9, 9.0]]))  # (2, 2) -> (2, 2, 8)
        arch.bucket_ids(torch.tensor([[0.0, 0.7], [2.9, 9.0]]))  # [[0, 1], [2, 3]]
    """

    boundaries: torch.Tensor  # buffers (register_buffer)
    offsets: torch.Tensor

    def __init__(self, *, num_dense: int, buckets: int, max_value: float, dim: int) -> None:
        super().__init__()
        if buckets and buckets < 3:
            raise ValueError(f"model.dense_buckets must be 0 (off) or >= 3, got {buckets}")
        self.num_dense, self.buckets, self.dim = num_dense, buckets, dim
        self.num_tokens = num_dense if buckets else 0
        # boundaries 0 = b_0 < ... < b_{K-2} = max: bucketize gives i with b_{i-1} < x <= b_i
        self.register_buffer("boundaries", torch.linspace(0.0, max_value, max(buckets - 1, 2)), persistent=False)
        self.register_buffer("offsets", torch.arange(num_dense) * max(buckets, 1), persistent=False)
        self.table = nn.Embedding(num_dense * buckets, dim) if self.num_tokens else None
        if self.table is not None:
            nn.init.normal_(self.table.weight, std=0.01)

    def bucket_ids(self, dense: torch.Tensor) -> torch.Tensor:
        """Bucket index in [0, K) of every dense value: (B, n) float -> (B, n) int64."""
        return torch.bucketize(dense.contiguous(), self.boundaries)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        B = dense.shape[0]
        if self.table is None:
            return dense.new_zeros(B, 0, self.dim)  # (B, 0, D)
        ids = self.bucket_ids(dense) + self.offsets  # (B, n) rows of the (n*K, D) table
        # `self.table(ids)` in values; index_select's backward (an index_add_) is ~0.6 ms a step faster at batch 1,024
        # than the embedding's (which sorts the ids)
        return self.table.weight.index_select(0, ids.reshape(-1)).view(B, self.num_dense, self.dim)  # (B, n, D)


class FactorizationMachine(nn.Module):
    """Second-order FM term: sum over field pairs i < j of <v_i, v_j>, by the O(F*D) identity.

    0.5 * sum_d [ (sum_f v_fd)^2 - sum_f v_fd^2 ].

    Example::

        fm = FactorizationMachine()
        fm(torch.ones(2, 3, 4))  # 3 pairs x <1,1> of width 4 = 12 per example -> (2,)
    """

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        square_of_sum = v.sum(dim=1).pow(2)  # (B, D)
        sum_of_square = v.pow(2).sum(dim=1)  # (B, D)
        return 0.5 * (square_of_sum - sum_of_square).sum(dim=1)  # (B,)


class CrossNetV2(nn.Module):
    """DCN-V2 cross network: x_{l+1} = x_0 * (W_l x_l + b_l) + x_l (Wang et al. 2021, eq. 1).

    Each layer adds one degree of explicit feature crossing.  W_l is full rank (d x d), or with
    `rank` r > 0 the paper's low-rank form W_l = U_l V_l^T (U_l, V_l: d x r), 2*d*r weights instead
    of d^2 (the paper's answer to the d^2 cost).

    Args:
        in_dim: d, the width of x_0.
        num_layers: L.
        rank: r; 0 = full rank.

    Example::

        cross = CrossNetV2(in_dim=6, num_layers=2)
        y = cross(torch.randn(4, 6))  # (4, 6) -> (4, 6)
        CrossNetV2(in_dim=6, num_layers=2, rank=2)(torch.randn(4, 6))  # same shapes, W = U V^T
    """

    def __init__(self, *, in_dim: int, num_layers: int, rank: int = 0) -> None:
        super().__init__()
        if rank < 0:
            raise ValueError(f"model.cross_rank must be >= 0 (0 = full rank), got {rank}")
        if rank:  # x -> U (V^T x) + b
            self.layers = nn.ModuleList(
                nn.Sequential(nn.Linear(in_dim, rank, bias=False), nn.Linear(rank, in_dim)) for _ in range(num_layers)
            )
        else:
            self.layers = nn.ModuleList(nn.Linear(in_dim, in_dim) for _ in range(num_layers))
        for layer in self.layers:  # start near the identity map x_{l+1} ~ x_l (U small when low rank)
            lin = cast(nn.Linear, layer[-1] if isinstance(layer, nn.Sequential) else layer)  # Sequential: low rank
            nn.init.normal_(lin.weight, std=0.01)
            nn.init.zeros_(lin.bias)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x  # (B, d)
        return x


class CrossTerm(nn.Module):
    """A logit from explicit feature crosses: Linear(CrossNetV2(x0)) with the Linear at zero.

    The attention model's second path to pairwise interactions (`model.cross`): a cross layer
    multiplies x0 elementwise with a linear map of itself, so the products of two fields' embedding
    dimensions (an FM's pairs) are one layer away, where an MLP must approximate them.  The output
    layer starts at zero, so the term adds nothing until it is trained, and its parameters can be held
    still on days too small to estimate crosses (`optim.cross_lr_scale`).

    Args:
        in_dim: d, the width of x0 (the flattened tokens).
        num_layers, rank: of the cross network (`model.cross_layers`, `model.cross_rank`).

    Example::

        term = CrossTerm(in_dim=6, num_layers=2)
        term(torch.randn(4, 6))  # (4, 6) -> (4,), all zeros before training
    """

    def __init__(self, *, in_dim: int, num_layers: int, rank: int = 0) -> None:
        super().__init__()
        self.net = CrossNetV2(in_dim=in_dim, num_layers=num_layers, rank=rank)
        self.head = nn.Linear(in_dim, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x0)).squeeze(-1)  # (B, d) -> (B,)
