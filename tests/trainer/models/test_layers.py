"""The shared blocks: dense buckets and their tokens, the MLP on column blocks, the FM identity, the DCN-V2 cross layer
(full and low rank)."""

from __future__ import annotations

import pytest
import torch

from trainer.models.config import ModelConfig
from trainer.models.layers import (
    CrossNetV2,
    DenseArch,
    FactorizationMachine,
    OverArch,
    concat_linear,
)
from trainer.models.reference import DCNv2Arch


def test_dense_arch_buckets_and_tokens() -> None:
    torch.manual_seed(0)
    arch = DenseArch(num_dense=2, buckets=4, max_value=3.0, dim=8)  # boundaries 0, 1.5, 3
    x = torch.tensor([[0.0, 0.7], [2.9, 9.0], [1.5, -0.0]])
    torch.testing.assert_close(arch.bucket_ids(x), torch.tensor([[0, 1], [2, 3], [1, 0]]))
    tokens = arch(x)
    assert tokens.shape == (3, 2, 8)
    torch.testing.assert_close(tokens[0, 0], arch.table.weight[0])  # feature 0, bucket 0 (zero or missing)
    torch.testing.assert_close(tokens[1, 1], arch.table.weight[1 * 4 + 3])  # feature 1, bucket 3
    assert DenseArch(num_dense=2, buckets=0, max_value=3.0, dim=8)(x).shape == (3, 0, 8)
    with pytest.raises(ValueError, match="dense_buckets must be 0"):
        DenseArch(num_dense=2, buckets=2, max_value=3.0, dim=8)


def test_dense_arch_tokens_get_the_gradient_of_an_embedding_lookup() -> None:
    torch.manual_seed(0)
    arch = DenseArch(num_dense=3, buckets=4, max_value=3.0, dim=2)
    x = torch.tensor([[0.0, 0.7, 9.0], [0.0, 2.9, 9.0]])
    g = torch.randn(2, 3, 2)
    (arch(x) * g).sum().backward()
    lookup = torch.nn.Embedding.from_pretrained(arch.table.weight.detach().clone(), freeze=False)
    (lookup(arch.bucket_ids(x) + arch.offsets) * g).sum().backward()
    assert lookup.weight.grad is not None and arch.table.weight.grad is not None
    torch.testing.assert_close(arch.table.weight.grad, lookup.weight.grad)  # row 0 (feature 0, bucket 0) summed twice
    assert arch.table.weight.grad[0].abs().sum() > 0


@pytest.mark.parametrize("dense_grad", [False, True])
def test_an_mlp_on_column_blocks_is_the_mlp_on_their_cat(dense_grad: bool) -> None:
    """The blocks' values and every gradient (the weight's, the bias's, each block's that wants one) are those of the
    cat; a block that wants no gradient gets none; without gradients the cat runs as is (what torch.export traces)."""
    torch.manual_seed(0)
    over = OverArch(in_dim=2 + 12, mlp_dims=(8, 4))
    dense = torch.randn(5, 2, requires_grad=dense_grad)
    a, b = torch.randn(5, 8, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    got = over((dense, a, b))
    got.pow(2).sum().backward()
    grads = [p.grad.clone() for p in over.parameters() if p.grad is not None] + [a.grad, b.grad, dense.grad]
    over.zero_grad()
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in (dense, a, b)]
    want = over(torch.cat(leaves, dim=1))
    want.pow(2).sum().backward()
    torch.testing.assert_close(got, want)
    wanted = [p.grad for p in over.parameters() if p.grad is not None] + [
        leaves[1].grad,
        leaves[2].grad,
        leaves[0].grad,
    ]
    assert len(grads) == len(wanted) == 3 * 2 + 3  # three layers weight and bias, three blocks
    assert (grads[-1] is None) == (wanted[-1] is None) == (not dense_grad)
    for g, w in zip(grads, wanted, strict=True):
        if w is not None:
            torch.testing.assert_close(g, w)
    with torch.no_grad():
        torch.testing.assert_close(concat_linear((dense, a, b), over.mlp[0]), over.mlp[0](torch.cat([dense, a, b], 1)))


def test_factorization_machine_equals_pairwise_sum() -> None:
    torch.manual_seed(0)
    v = torch.randn(4, 5, 3)
    want = sum((v[:, i] * v[:, j]).sum(-1) for i in range(5) for j in range(i + 1, 5))
    torch.testing.assert_close(FactorizationMachine()(v), want, rtol=1e-5, atol=1e-5)


def test_cross_net_v2_formula() -> None:
    torch.manual_seed(0)
    cross = CrossNetV2(in_dim=3, num_layers=1)
    x0 = torch.randn(2, 3)
    lin = cross.layers[0]
    torch.testing.assert_close(cross(x0), x0 * lin(x0) + x0)
    assert CrossNetV2(in_dim=3, num_layers=0)(x0) is x0


def test_low_rank_cross_net_v2_factorises_w() -> None:
    torch.manual_seed(0)
    cross = CrossNetV2(in_dim=6, num_layers=2, rank=2)
    x0 = torch.randn(3, 6)
    x = x0
    for v, u in cross.layers:  # W = U V^T: d x r and r x d, one bias of width d
        x = x0 * (x @ v.weight.T @ u.weight.T + u.bias) + x
    torch.testing.assert_close(cross(x0), x)
    assert sum(p.numel() for p in cross.parameters()) == 2 * (2 * 6 * 2 + 6)
    with pytest.raises(ValueError, match="cross_rank must be >= 0"):
        CrossNetV2(in_dim=6, num_layers=1, rank=-1)
    with pytest.raises(ValueError, match="model.cross_layers and model.cross_rank >= 0"):
        ModelConfig(dropout=0.0, cross_rank=-1)
    dcn = DCNv2Arch(
        ModelConfig(dropout=0.0, arch="dcn_v2", mlp_dims=(4,), dense_buckets=0, cross_rank=2),
        num_dense=1,
        num_fields=2,
        dim=3,
    )
    assert dcn.cross.layers[0][0].weight.shape == (2, 1 + 2 * 3)  # V^T: r x d, d = n + F*D
