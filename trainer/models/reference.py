"""Reference architectures, selectable with `model.arch`; all share the store's embedding path.

Every architecture is an `nn.Module` built as `Arch(config, num_dense=n, num_fields=F, dim=D)`
whose `forward(dense (B, n), emb (B, F, D)) -> logits (B,)` is what `trainer.models.ctr_model.CTRModel`
calls: the embedding rows come from the store (one row of width D per key, trained by the
store's sparse Adam), never from module parameters.  What each one reads from a row:

- `lr`:     logistic regression on the keys: the per-key weight is the row's FIRST dimension
            e[0] (dimensions 1..D-1 receive no gradient and stay at their initial values).
            This is exact one-hot LR (a free weight per key, Adam-trained), not a low-rank
            projection; the price is D-1 unused floats per row, so run it with a small
            `store.embedding_dim` (2 is enough) when memory matters.
- `dnn`:    Paddle's CTR-DNN: concatenated field embeddings + dense values -> 400-400-400 ReLU MLP.
- `deepfm`: DeepFM (Guo et al. 2017): a row is [w | v]: e[0] is the key's first-order weight,
            e[1:] its FM factor vector, shared by the FM term and the deep MLP.
- `dcn_v2`: DCN-V2 (Wang et al. 2021), parallel form: a cross network and an MLP on the same
            x_0 = [flattened embeddings, dense values], concatenated into one logit.

Dense features enter every architecture as raw log1p values (a linear term or an MLP input)
and, when `model.dense_buckets > 0`, also as one learned token per feature appended to the
fields (`DenseArch`), so (B, F, D) becomes (B, F + n, D).
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.config import ModelConfig
from trainer.models.layers import (
    CrossNetV2,
    DenseArch,
    FactorizationMachine,
    OverArch,
    dense_linear,
)


def dense_arch(config: ModelConfig, *, num_dense: int, dim: int) -> DenseArch:
    """The `DenseArch` every architecture builds from `model.dense_buckets` / `model.dense_bucket_max`."""
    return DenseArch(num_dense=num_dense, buckets=config.dense_buckets, max_value=config.dense_bucket_max, dim=dim)


class LRArch(nn.Module):
    """Logistic regression: bias + sum_f w(key_f) + <a, dense>, with w(key) = the key's row e[0].

    Args:
        config: `dense_buckets` (a bucketised dense feature adds its bucket's weight).
        num_dense, num_fields, dim: n, F, D.

    Example::

        lr = LRArch(ModelConfig(arch="lr"), num_dense=2, num_fields=3, dim=4)
        logits = lr(torch.randn(5, 2), torch.randn(5, 3, 4))  # (5,)
    """

    def __init__(self, config: ModelConfig, *, num_dense: int, num_fields: int, dim: int) -> None:
        super().__init__()
        self.dense_arch = dense_arch(config, num_dense=num_dense, dim=1)
        self.linear = dense_linear(num_dense)  # dense weights + the global bias

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        w = emb[:, :, 0].sum(dim=1)  # (B, F) -> (B,)
        w = w + self.dense_arch(dense)[:, :, 0].sum(dim=1)  # (B, n, 1) bucket weights -> (B,)
        return self.linear(dense).squeeze(-1) + w  # (B,)


class DNNArch(nn.Module):
    """CTR-DNN (PaddleRec `ctr_dnn`): [flatten(emb), dense] -> MLP (400-400-400 by default) -> logit.

    Args:
        config: `mlp_dims`, `dropout`, `dense_buckets`.
        num_dense, num_fields, dim: n, F, D.

    Example::

        dnn = DNNArch(ModelConfig(arch="dnn", mlp_dims=(8,), dropout=0.0), num_dense=2, num_fields=3, dim=4)
        logits = dnn(torch.randn(5, 2), torch.randn(5, 3, 4))  # (5, 2 + 3*4) -> (5,)
    """

    def __init__(self, config: ModelConfig, *, num_dense: int, num_fields: int, dim: int) -> None:
        super().__init__()
        self.dense_arch = dense_arch(config, num_dense=num_dense, dim=dim)
        in_dim = num_dense + (num_fields + self.dense_arch.num_tokens) * dim
        self.over = OverArch(in_dim=in_dim, mlp_dims=config.mlp_dims, dropout=config.resolved().dropout)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        B = emb.shape[0]
        tokens = torch.cat([emb, self.dense_arch(dense)], dim=1)  # (B, F + n_b, D)
        return self.over(torch.cat([dense, tokens.reshape(B, -1)], dim=1))  # (B, n + (F+n_b)*D) -> (B,)


class DeepFMArch(nn.Module):
    """DeepFM: first-order (e[0] per key + linear dense) + FM(e[1:]) + MLP([flatten(e[1:]), dense]).

    Args:
        config: `mlp_dims`, `dropout`, `dense_buckets`.
        num_dense, num_fields, dim: n, F, D (D >= 2: one weight plus at least one factor).

    Example::

        fm = DeepFMArch(ModelConfig(arch="deepfm", mlp_dims=(8,), dropout=0.0), num_dense=2, num_fields=3, dim=5)
        logits = fm(torch.randn(5, 2), torch.randn(5, 3, 5))  # (5,)
    """

    def __init__(self, config: ModelConfig, *, num_dense: int, num_fields: int, dim: int) -> None:
        super().__init__()
        if dim < 2:
            raise ValueError(f"model.arch='deepfm' needs store.embedding_dim >= 2 (weight + factors), got {dim}")
        self.dense_arch = dense_arch(config, num_dense=num_dense, dim=dim)
        self.linear = dense_linear(num_dense)
        self.fm = FactorizationMachine()
        in_dim = num_dense + (num_fields + self.dense_arch.num_tokens) * (dim - 1)
        self.over = OverArch(in_dim=in_dim, mlp_dims=config.mlp_dims, dropout=config.resolved().dropout)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        B = emb.shape[0]
        tokens = torch.cat([emb, self.dense_arch(dense)], dim=1)  # (B, F', D)
        w, v = tokens[:, :, 0], tokens[:, :, 1:]  # (B, F'), (B, F', D-1)
        first = self.linear(dense).squeeze(-1) + w.sum(dim=1)  # (B,)
        deep = self.over(torch.cat([dense, v.reshape(B, -1)], dim=1))  # (B,)
        return first + self.fm(v) + deep  # (B,)


class DCNv2Arch(nn.Module):
    """DCN-V2, parallel: x0 = [flatten(emb), dense]; logit = Linear([CrossNet(x0), MLP-hidden(x0)]).

    Args:
        config: `cross_layers`, `cross_rank`, `mlp_dims`, `dropout`, `dense_buckets`.
        num_dense, num_fields, dim: n, F, D.

    Example::

        dcn = DCNv2Arch(ModelConfig(arch="dcn_v2", mlp_dims=(8,), dropout=0.0), num_dense=2, num_fields=3, dim=4)
        logits = dcn(torch.randn(5, 2), torch.randn(5, 3, 4))  # x0 (5, 14) -> (5,)
    """

    def __init__(self, config: ModelConfig, *, num_dense: int, num_fields: int, dim: int) -> None:
        super().__init__()
        self.dense_arch = dense_arch(config, num_dense=num_dense, dim=dim)
        in_dim = num_dense + (num_fields + self.dense_arch.num_tokens) * dim
        self.cross = CrossNetV2(in_dim=in_dim, num_layers=config.cross_layers, rank=config.cross_rank)
        deep: list[nn.Module] = []
        width = in_dim
        for hidden in config.mlp_dims:
            # a Dropout even at 0: the layers' names do not depend on the (per-day) dropout
            deep += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(config.resolved().dropout)]
            width = hidden
        self.deep = nn.Sequential(*deep)
        self.head = nn.Linear(in_dim + width, 1)

    def forward(self, dense: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        B = emb.shape[0]
        tokens = torch.cat([emb, self.dense_arch(dense)], dim=1)  # (B, F', D)
        x0 = torch.cat([dense, tokens.reshape(B, -1)], dim=1)  # (B, d)
        return self.head(torch.cat([self.cross(x0), self.deep(x0)], dim=1)).squeeze(-1)  # (B, 2 parts) -> (B,)


REFERENCE_ARCHS: dict[str, type[nn.Module]] = {
    "lr": LRArch,
    "dnn": DNNArch,
    "deepfm": DeepFMArch,
    "dcn_v2": DCNv2Arch,
}
"""`model.arch` name -> architecture class; `attention` (the default) is `trainer.models.ctr_model.CTRModel` itself."""
