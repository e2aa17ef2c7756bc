"""Shapes, seeded values and defining properties of the reference architectures and their blocks."""

from __future__ import annotations

import pytest
import torch

from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel
from trainer.models.layers import CrossNetV2, DenseArch, FactorizationMachine
from trainer.models.reference import DCNv2Arch, DeepFMArch, DNNArch, LRArch


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
        ModelConfig(cross_rank=-1)
    dcn = DCNv2Arch(ModelConfig(arch="dcn_v2", mlp_dims=(4,), dense_buckets=0, cross_rank=2), num_dense=1, num_fields=2, dim=3)
    assert dcn.cross.layers[0][0].weight.shape == (2, 1 + 2 * 3)  # V^T: r x d, d = n + F*D


def test_lr_arch_is_logistic_regression_on_first_dim() -> None:
    arch = LRArch(ModelConfig(arch="lr", dense_buckets=0), num_dense=2, num_fields=3, dim=4)
    with torch.no_grad():
        arch.linear.weight.copy_(torch.tensor([[1.0, -2.0]]))
        arch.linear.bias.fill_(0.5)
    dense = torch.tensor([[1.0, 1.0]])
    emb = torch.zeros(1, 3, 4)
    emb[0, :, 0] = torch.tensor([0.1, 0.2, 0.3])
    emb[0, :, 1:] = 7.0  # other dims are ignored
    torch.testing.assert_close(arch(dense, emb), torch.tensor([0.5 + 1 - 2 + 0.6]))
    emb.requires_grad_(True)
    arch(dense, emb).sum().backward()
    assert torch.equal(emb.grad[0, :, 0], torch.ones(3)) and not emb.grad[0, :, 1:].any()


@pytest.mark.parametrize("cls", [DNNArch, DeepFMArch, DCNv2Arch, LRArch])
@pytest.mark.parametrize("buckets", [0, 5])
def test_reference_arch_shapes_and_gradients(cls: type, buckets: int) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(arch="dnn", mlp_dims=(8, 4), dense_buckets=buckets, cross_layers=2)
    arch = cls(cfg, num_dense=3, num_fields=4, dim=5)
    dense, emb = torch.rand(6, 3) * 4, torch.randn(6, 4, 5, requires_grad=True)
    out = arch(dense, emb)
    assert out.shape == (6,) and torch.isfinite(out).all()
    out.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0


def test_deepfm_decomposes_into_first_order_fm_and_deep() -> None:
    torch.manual_seed(0)
    arch = DeepFMArch(ModelConfig(arch="deepfm", mlp_dims=(4,), dense_buckets=0), num_dense=1, num_fields=3, dim=3)
    dense, emb = torch.rand(2, 1), torch.randn(2, 3, 3)
    v = emb[:, :, 1:]
    want = (arch.linear(dense).squeeze(-1) + emb[:, :, 0].sum(1) + FactorizationMachine()(v)
            + arch.over(torch.cat([dense, v.reshape(2, -1)], 1)))
    torch.testing.assert_close(arch(dense, emb), want)
    with pytest.raises(ValueError, match="embedding_dim >= 2"):
        DeepFMArch(ModelConfig(arch="deepfm"), num_dense=1, num_fields=3, dim=1)


@pytest.mark.parametrize("arch", ["attention", "lr", "dnn", "deepfm", "dcn_v2"])
def test_ctr_model_dispatches_every_arch_with_seeded_values(arch: str) -> None:
    torch.manual_seed(0)
    model = CTRModel(ModelConfig(arch=arch, num_heads=2, mlp_dims=(8,), dense_buckets=4), num_dense=2, num_fields=3, dim=4)
    torch.manual_seed(1)
    dense, emb = torch.rand(2, 2), torch.randn(2, 3, 4)
    a, b = model.eval()(dense, emb), model(dense, emb)
    assert a.shape == (2,) and torch.equal(a, b)  # deterministic in eval mode
    assert (arch == "attention") == (not hasattr(model, "net"))
    with pytest.raises(ValueError, match="expects dense"):
        model(torch.rand(2, 3), emb)


def test_attention_wide_term_adds_first_dims() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(num_heads=1, mlp_dims=(4,), dense_buckets=0)
    model = CTRModel(cfg, num_dense=1, num_fields=2, dim=2).eval()
    dense, emb = torch.rand(3, 1), torch.randn(3, 2, 2)
    deep = model.over(model.interaction(dense, model.attention(emb)))
    torch.testing.assert_close(model(dense, emb), deep + model.wide(dense).squeeze(-1) + emb[:, :, 0].sum(1))
    scaled = CTRModel(ModelConfig(num_heads=1, mlp_dims=(4,), wide_scale=0.5, dense_buckets=0), num_dense=1, num_fields=2, dim=2).eval()
    scaled.load_state_dict(model.state_dict())
    torch.testing.assert_close(scaled(dense, emb), deep + model.wide(dense).squeeze(-1) + 0.5 * emb[:, :, 0].sum(1))


def test_model_config_validation() -> None:
    with pytest.raises(ValueError, match="model.arch must be one of"):
        ModelConfig(arch="xgboost")
    with pytest.raises(ValueError, match="dense_buckets"):
        ModelConfig(dense_buckets=2)
    with pytest.raises(ValueError, match="wide_scale"):
        ModelConfig(wide_scale=0.0)
