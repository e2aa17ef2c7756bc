"""Shapes and seeded values of the model's sub-architectures."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from trainer.models.config import ModelConfig
from trainer.models.ctr_model import (
    BIAS_SCALE,
    CROSS_PREFIX,
    CTRModel,
    InteractionArch,
    SequenceAttention,
    self_attention,
)
from trainer.models.layers import OverArch


def test_sequence_attention_shape_and_seeded_values() -> None:
    torch.manual_seed(0)
    att = SequenceAttention(dim=4, num_heads=2, num_layers=1)
    x = torch.ones(1, 2, 4) * torch.arange(4.0)  # (B=1, F=2, D=4), two identical fields
    y = att(x)
    assert y.shape == (1, 2, 4)
    want = torch.tensor([-1.3153119, -0.3080799, 0.1569724, 1.4664196])
    torch.testing.assert_close(y[0, 0], want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[0, 1], want, rtol=1e-5, atol=1e-5)  # identical fields, identical outputs
    torch.testing.assert_close(y.mean(-1), torch.zeros(1, 2), atol=1e-5, rtol=0)  # layernorm output


def test_sequence_attention_layers() -> None:
    x = torch.randn(3, 5, 8)
    assert torch.equal(SequenceAttention(dim=8, num_heads=2, num_layers=0)(x), x)  # 0 layers: identity
    assert SequenceAttention(dim=8, num_heads=4, num_layers=3)(x).shape == (3, 5, 8)
    with pytest.raises(ValueError, match=r"embedding_dim \(6\) must be divisible by model.num_heads \(4\)"):
        SequenceAttention(dim=6, num_heads=4, num_layers=1)


def test_sequence_attention_is_permutation_equivariant_over_fields() -> None:
    torch.manual_seed(0)
    att = SequenceAttention(dim=8, num_heads=2, num_layers=2)
    x = torch.randn(2, 5, 8)
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(att(x)[:, perm], att(x[:, perm]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_self_attention_is_torch_multihead_attention_in_values_and_gradients(heads: int, training: bool) -> None:
    """The plain-matmul attention computes what `nn.MultiheadAttention` computes, on its parameters: a model
    saved before it loads and scores the same.  In training (no dropout here) a CPU runs the kernel of
    `trainer.models.attention_cpu`, in eval the plain matmuls: both are checked."""
    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(8, heads, batch_first=True).train(training)
    x = torch.randn(6, 5, 8, requires_grad=True)
    mine = self_attention(attn, x)
    theirs = attn(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(mine)
    (mine_x,) = torch.autograd.grad(mine, x, g)
    (theirs_x,) = torch.autograd.grad(theirs, x, g)
    torch.testing.assert_close(mine_x, theirs_x, rtol=1e-5, atol=1e-6)
    mine_w = torch.autograd.grad(self_attention(attn, x), attn.in_proj_weight, g)[0]
    theirs_w = torch.autograd.grad(attn(x, x, x, need_weights=False)[0], attn.in_proj_weight, g)[0]
    torch.testing.assert_close(mine_w, theirs_w, rtol=1e-5, atol=1e-6)


def test_self_attention_drops_attention_weights_only_in_training() -> None:
    torch.manual_seed(0)
    attn = torch.nn.MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
    x = torch.randn(4, 5, 8)
    assert not torch.allclose(self_attention(attn, x), self_attention(attn, x))  # two dropout masks
    attn.eval()
    torch.testing.assert_close(self_attention(attn, x), attn(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-6)


def test_interaction_and_over_arch() -> None:
    inter = InteractionArch(num_dense=2, num_fields=3, dim=4)
    dense, fields = torch.randn(5, 2), torch.randn(5, 3, 4)
    z = inter(dense, fields)
    assert z.shape == (5, 2 + 12) and inter.out_dim == 14
    assert torch.equal(z[:, :2], dense) and torch.equal(z[:, 2:6], fields[:, 0])
    over = OverArch(in_dim=14, mlp_dims=(8, 4))
    assert over(z).shape == (5,)
    lin = OverArch(in_dim=2, mlp_dims=(1,))
    with torch.no_grad():  # relu(x0 + 2*x1) * 3 + 1
        lin.mlp[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
        lin.mlp[0].bias.zero_()
        lin.mlp[3].weight.fill_(3.0)
        lin.mlp[3].bias.fill_(1.0)
    torch.testing.assert_close(lin(torch.tensor([[1.0, 1.0], [-5.0, 1.0]])), torch.tensor([10.0, 1.0]))


def test_ctr_model_shapes_and_seeded_values() -> None:
    torch.manual_seed(0)
    model = CTRModel(
        ModelConfig(dropout=0.0, num_heads=2, mlp_dims=(8, 4), wide=False, dense_buckets=0),
        num_dense=3,
        num_fields=4,
        dim=4,
    )
    torch.manual_seed(1)
    dense, emb = torch.rand(2, 3), torch.randn(2, 4, 4)
    logits = model(dense, emb)
    assert logits.shape == (2,)
    torch.testing.assert_close(logits, torch.tensor([0.3711708, 0.3795505]), rtol=1e-5, atol=1e-5)
    # gradients reach the (store-provided) embeddings
    emb.requires_grad_(True)
    model(dense, emb).sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    # embeddings are not parameters of the model
    n = sum(p.numel() for p in model.parameters())
    cross = 3 * (16 * 16 + 16) + (16 + 1)  # model.cross: 3 full-rank layers on the 4 x 4 tokens, then its head
    assert n == (3 * 4 * 4 + 3 * 4) + (4 * 4 + 4) + (4 + 4) + (19 * 8 + 8) + (8 * 4 + 4) + (4 + 1) + cross + 1  # + bias


def test_the_cross_term_adds_nothing_until_trained_and_changes_no_other_draw() -> None:
    config = ModelConfig(dropout=0.0, num_heads=2, mlp_dims=(8,))
    torch.manual_seed(0)
    with_cross = CTRModel(config, num_dense=3, num_fields=4, dim=4)
    after = torch.rand(3)  # the global RNG after the build: dropout masks and data draws come from it
    torch.manual_seed(0)
    without = CTRModel(dataclasses.replace(config, cross=False), num_dense=3, num_fields=4, dim=4)
    torch.testing.assert_close(torch.rand(3), after)
    mine = with_cross.state_dict()
    assert {k for k in mine if not k.startswith(CROSS_PREFIX)} == set(without.state_dict())
    assert all(torch.equal(mine[k], v) for k, v in without.state_dict().items())
    dense, emb = torch.rand(5, 3), torch.randn(5, 4, 4)
    torch.testing.assert_close(with_cross(dense, emb), without(dense, emb))
    with torch.no_grad():  # once its head has weights, the crosses reach the logit
        with_cross.cross.head.weight.fill_(0.1)
    assert not torch.allclose(with_cross(dense, emb), without(dense, emb))
    # a model saved before the term existed does not fit: `trainer.model_dir.warm_start` starts its dense part cold
    with pytest.raises(RuntimeError, match=r"Missing key\(s\) in state_dict: \"cross"):
        with_cross.load_state_dict(without.state_dict(), strict=True)


def test_ctr_model_rejects_wrong_shapes() -> None:
    model = CTRModel(ModelConfig(dropout=0.0, num_heads=1, mlp_dims=(4,)), num_dense=2, num_fields=3, dim=2)
    with pytest.raises(ValueError, match=r"expects dense \(B, 2\) and emb \(B, 3, 2\)"):
        model(torch.randn(4, 2), torch.randn(4, 2, 2))
    assert CTRModel(ModelConfig(dropout=0.0, num_heads=1, mlp_dims=(4,)), num_dense=0, num_fields=1, dim=2)(
        torch.zeros(3, 0), torch.randn(3, 1, 2)
    ).shape == (3,)


@pytest.mark.parametrize("arch", ["attention", "lr", "dnn"])
def test_scaled_bias_shifts_the_logit_and_a_state_dict_without_it_does_not_fit(arch: str) -> None:
    torch.manual_seed(0)
    model = CTRModel(
        ModelConfig(dropout=0.0, arch=arch, num_heads=1, mlp_dims=(4,)), num_dense=2, num_fields=3, dim=2
    ).eval()
    dense, emb = torch.rand(4, 2), torch.randn(4, 3, 2)
    before = model(dense, emb)
    with torch.no_grad():
        model.bias.fill_(0.1)
    torch.testing.assert_close(model(dense, emb), before + BIAS_SCALE * 0.1)
    # a saved model either fits or is refused (`trainer.model_dir.warm_start` says so before a run)
    other = {k: v for k, v in model.state_dict().items() if k != "bias"}
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "bias"'):
        model.load_state_dict(other, strict=True)


@pytest.mark.parametrize("arch", ["attention", "lr", "dnn", "deepfm", "dcn_v2"])
def test_a_log_without_dense_fields_builds_without_warnings(arch: str) -> None:
    """Avazu has no dense fields: building and running the model warns about nothing a user could act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = CTRModel(ModelConfig(arch=arch, dropout=0.0), num_dense=0, num_fields=3, dim=4)
        logits = model(torch.zeros(2, 0), torch.randn(2, 3, 4))
    assert logits.shape == (2,)


@pytest.mark.parametrize("arch", ["attention", "dnn", "deepfm", "dcn_v2"])
def test_a_model_trained_with_dropout_loads_into_one_without(arch: str) -> None:
    # the recipe derives dropout per day (several passes: > 0, one pass: 0); the warm start must still fit
    torch.manual_seed(0)
    with_dropout = CTRModel(ModelConfig(arch=arch, mlp_dims=(8, 4), dropout=0.3), num_dense=2, num_fields=3, dim=4)
    without = CTRModel(ModelConfig(arch=arch, mlp_dims=(8, 4), dropout=0.0), num_dense=2, num_fields=3, dim=4)
    without.load_state_dict(with_dropout.state_dict(), strict=True)
    dense, emb = torch.rand(5, 2), torch.randn(5, 3, 4)
    with_dropout.eval()
    torch.testing.assert_close(without(dense, emb), with_dropout(dense, emb))  # the same function in eval mode


def test_a_model_with_dropout_auto_is_refused() -> None:
    with pytest.raises(ValueError, match=r"model.dropout is 'auto'"):
        CTRModel(ModelConfig(), num_dense=2, num_fields=3, dim=4)


def test_a_cross_term_on_the_fields_alone_is_narrower_and_blind_to_the_bucket_tokens() -> None:
    """`model.cross_input: fields` crosses the F field tokens, not the n dense bucket tokens: (F*D)^2 per layer
    instead of ((F+n)*D)^2, and the bucket tokens reach the logit only through the attention and the MLP."""
    config = ModelConfig(num_heads=2, mlp_dims=(8,), dropout=0.0, dense_buckets=4, cross_input="fields")
    torch.manual_seed(0)
    model = CTRModel(config, num_dense=3, num_fields=4, dim=4)
    tokens = CTRModel(dataclasses.replace(config, cross_input="tokens"), num_dense=3, num_fields=4, dim=4)
    assert model.cross.head.in_features == 4 * 4 and tokens.cross.head.in_features == (4 + 3) * 4
    with torch.no_grad():
        model.cross.head.weight.fill_(0.1)
    dense, emb = torch.rand(5, 3), torch.randn(5, 4, 4)
    crossed = model.cross(emb.reshape(5, -1))  # (B, F*D) -> (B,)
    held = model(dense, emb) - crossed
    model.cross.head.weight.data.zero_()
    torch.testing.assert_close(model(dense, emb), held)  # the cross term's logit is that of the field tokens
    with pytest.raises(ValueError, match="model.cross_input must be one of"):
        ModelConfig(cross_input="dense")


@pytest.mark.parametrize("training", [False, True])
def test_an_attention_over_the_fields_alone_leaves_the_bucket_tokens_out_and_as_they_are(training: bool) -> None:
    """`model.attention_input: fields`: the F field tokens attend over each other only, and the n dense bucket
    tokens join them after the attention, as they are; the same parameters as `tokens`, so a saved model of
    either loads into the other."""
    config = ModelConfig(num_heads=2, mlp_dims=(8,), dropout=0.0, dense_buckets=4, attention_input="fields")
    torch.manual_seed(0)
    model = CTRModel(config, num_dense=3, num_fields=4, dim=4).train(training)
    every = CTRModel(dataclasses.replace(config, attention_input="tokens"), num_dense=3, num_fields=4, dim=4)
    every.load_state_dict(model.state_dict())
    seen: list[tuple[torch.Tensor, ...]] = []  # the MLP's input blocks: dense, attended fields, bucket tokens
    model.over.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    emb = torch.randn(5, 4, 4, requires_grad=True)
    dense, other = torch.rand(5, 3), torch.rand(5, 3) * 5
    model(dense, emb).sum().backward()
    model(other, emb)
    torch.testing.assert_close(seen[0][1], model.attention(emb).flatten(1))  # the fields' attention, blind to the dense
    torch.testing.assert_close(seen[1][1], seen[0][1])
    torch.testing.assert_close(seen[0][2], model.dense_arch(dense).flatten(1))  # the bucket tokens, unattended
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    assert not torch.allclose(every.train(training)(dense, emb), model(dense, emb))  # another computation
    with pytest.raises(ValueError, match="model.attention_input must be one of"):
        ModelConfig(attention_input="dense")


def test_hold_cross_skips_a_zero_term_with_the_same_logits_and_runs_a_trained_one() -> None:
    torch.manual_seed(0)
    model = CTRModel(
        ModelConfig(num_heads=2, mlp_dims=(8,), dropout=0.0, dense_buckets=4), num_dense=3, num_fields=4, dim=4
    )
    dense, emb = torch.rand(5, 3), torch.randn(5, 4, 4)
    before = model(dense, emb)
    assert model.hold_cross() is True and model.cross_skipped
    assert torch.equal(model(dense, emb), before)  # a zero term adds exactly 0
    assert not any(p.requires_grad for p in model.cross.parameters())
    with torch.no_grad():
        model.cross.head.bias.fill_(0.5)  # trained on an earlier day
    assert model.hold_cross() is False
    assert torch.allclose(model(dense, emb), before + 0.5)  # it runs, held
    without = CTRModel(
        ModelConfig(num_heads=2, mlp_dims=(8,), dropout=0.0, cross=False), num_dense=3, num_fields=4, dim=4
    )
    assert without.hold_cross() is False
    assert (
        CTRModel(ModelConfig(arch="dnn", mlp_dims=(8,), dropout=0.0), num_dense=3, num_fields=4, dim=4).hold_cross()
        is False
    )


def test_the_wide_logit_is_the_wide_term_and_bias_alone_and_the_logits_are_forward() -> None:
    """`logits_and_wide` gives what `forward` gives, and the wide term's own logit: it moves with the key
    weights (column 0), the dense features' linear term and the bias, and with nothing the deep parts compute."""
    torch.manual_seed(0)
    model = CTRModel(
        ModelConfig(mlp_dims=(8,), dropout=0.0, dense_buckets=0, wide_scale=0.5), num_dense=3, num_fields=4, dim=4
    )
    with torch.no_grad():
        model.bias.fill_(0.3)
    dense, emb = torch.randn(6, 3), torch.randn(6, 4, 4)
    logits, wide = model.logits_and_wide(dense, emb)
    assert torch.equal(logits, model(dense, emb))
    assert wide is not None
    want = model.wide(dense).squeeze(-1) + 0.5 * emb[:, :, 0].sum(1) + BIAS_SCALE * 0.3
    torch.testing.assert_close(wide, want)
    wide.sum().backward()
    deep = [n for n, p in model.named_parameters() if not n.startswith(("wide.", "bias"))]
    assert deep and all(p.grad is None for n, p in model.named_parameters() if n in deep)
    assert model.bias.grad is not None and model.wide.weight.grad is not None
    for config in (
        ModelConfig(mlp_dims=(8,), dropout=0.0, wide=False),
        ModelConfig(arch="dnn", mlp_dims=(8,), dropout=0.0),
    ):
        plain = CTRModel(config, num_dense=3, num_fields=4, dim=4)
        logits, wide = plain.logits_and_wide(dense, emb)
        assert wide is None and torch.equal(logits, plain(dense, emb))
