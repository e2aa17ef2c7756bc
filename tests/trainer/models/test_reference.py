"""Shapes, seeded values and defining properties of the reference architectures."""

from __future__ import annotations

import pytest
import torch

from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel
from trainer.models.layers import FactorizationMachine
from trainer.models.reference import DCNv2Arch, DeepFMArch, DNNArch, LRArch


def test_lr_arch_is_logistic_regression_on_first_dim() -> None:
    arch = LRArch(ModelConfig(dropout=0.0, arch="lr", dense_buckets=0), num_dense=2, num_fields=3, dim=4)
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
    cfg = ModelConfig(dropout=0.0, arch="dnn", mlp_dims=(8, 4), dense_buckets=buckets, cross_layers=2)
    arch = cls(cfg, num_dense=3, num_fields=4, dim=5)
    dense, emb = torch.rand(6, 3) * 4, torch.randn(6, 4, 5, requires_grad=True)
    out = arch(dense, emb)
    assert out.shape == (6,) and torch.isfinite(out).all()
    out.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0


def test_deepfm_decomposes_into_first_order_fm_and_deep() -> None:
    torch.manual_seed(0)
    arch = DeepFMArch(
        ModelConfig(dropout=0.0, arch="deepfm", mlp_dims=(4,), dense_buckets=0), num_dense=1, num_fields=3, dim=3
    )
    dense, emb = torch.rand(2, 1), torch.randn(2, 3, 3)
    v = emb[:, :, 1:]
    want = (
        arch.linear(dense).squeeze(-1)
        + emb[:, :, 0].sum(1)
        + FactorizationMachine()(v)
        + arch.over(torch.cat([dense, v.reshape(2, -1)], 1))
    )
    torch.testing.assert_close(arch(dense, emb), want)
    with pytest.raises(ValueError, match="embedding_dim >= 2"):
        DeepFMArch(ModelConfig(dropout=0.0, arch="deepfm"), num_dense=1, num_fields=3, dim=1)


@pytest.mark.parametrize("arch", ["attention", "lr", "dnn", "deepfm", "dcn_v2"])
def test_ctr_model_dispatches_every_arch_with_seeded_values(arch: str) -> None:
    torch.manual_seed(0)
    model = CTRModel(
        ModelConfig(dropout=0.0, arch=arch, num_heads=2, mlp_dims=(8,), dense_buckets=4),
        num_dense=2,
        num_fields=3,
        dim=4,
    )
    torch.manual_seed(1)
    dense, emb = torch.rand(2, 2), torch.randn(2, 3, 4)
    a, b = model.eval()(dense, emb), model(dense, emb)
    assert a.shape == (2,) and torch.equal(a, b)  # deterministic in eval mode
    assert (arch == "attention") == (not hasattr(model, "net"))
    with pytest.raises(ValueError, match="expects dense"):
        model(torch.rand(2, 3), emb)


def test_attention_wide_term_adds_first_dims() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(dropout=0.0, num_heads=1, mlp_dims=(4,), dense_buckets=0)
    model = CTRModel(cfg, num_dense=1, num_fields=2, dim=2).eval()
    dense, emb = torch.rand(3, 1), torch.randn(3, 2, 2)
    deep = model.over(model.interaction(dense, model.attention(emb)))
    torch.testing.assert_close(model(dense, emb), deep + model.wide(dense).squeeze(-1) + emb[:, :, 0].sum(1))
    scaled = CTRModel(
        ModelConfig(dropout=0.0, num_heads=1, mlp_dims=(4,), wide_scale=0.5, dense_buckets=0),
        num_dense=1,
        num_fields=2,
        dim=2,
    ).eval()
    scaled.load_state_dict(model.state_dict())
    torch.testing.assert_close(scaled(dense, emb), deep + model.wide(dense).squeeze(-1) + 0.5 * emb[:, :, 0].sum(1))
