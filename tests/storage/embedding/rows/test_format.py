"""RowFormat: bytes per row and record, rounding in a step, refused steps, state conversion between optimizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.rows.format import ROW_DTYPES, STATE_DTYPES, RowFormat
from storage.embedding.rows.sparse_optim import ADAM_BETAS, OPTIMIZERS, convert_state, get_optimizer
from storage.embedding.ssd.disk_format import RecordLayout
from tests.helpers.stores import DIM, FORMATS


def test_int8_rows_with_adams_moments_in_log8_make_a_64_byte_record_and_adagrads_36() -> None:
    adam8 = RecordLayout.of(RowFormat(16, "adam", "int8", "log8"))
    assert adam8.record_bytes == 64 and adam8.rows_per_unit == 64  # 16 codes + scale, offset 4 + m 16 + v 16 + 12
    ada8 = RecordLayout.of(RowFormat(16, "rowwise_adagrad", "int8"))
    assert ada8.record_bytes == 36 and ada8.rows_per_unit == 113  # 20 + fp32 accumulator 4 + clock 4 + key 8
    assert RowFormat(16, "adam", "int8", "log8").row_bytes() == 56
    assert RowFormat(16, "rowwise_adagrad", "fp16", "log8").row_bytes() == 32 + 1 + 4


def test_partial_rowwise_adam_on_symmetric_int8_rows_makes_a_47_byte_record() -> None:
    fmt = RowFormat(16, "partial_rowwise_adam", "int8s", "log8")
    layout = RecordLayout.of(fmt)
    assert layout.record_bytes == 47 and layout.rows_per_unit == 87  # 16 codes + scale 2 + m 16 + v 1 + clock 4 + key 8
    assert RecordLayout.of(RowFormat(16, "partial_rowwise_adam", "int8", "log8")).record_bytes == 49
    assert fmt.width == 18 and fmt.row_bytes() == 39


def test_wide_rowwise_adam_on_symmetric_int8_rows_makes_a_48_byte_record() -> None:
    fmt = RowFormat(16, "wide_rowwise_adam", "int8s", "log8")
    layout = RecordLayout.of(fmt)
    assert layout.record_bytes == 48 and layout.rows_per_unit == 85  # 18 + m 16 + v 2 + clock 4 + key 8
    assert layout.record.fields["v"][0].shape == (2,)
    with pytest.raises(ValueError, match="embedding_dim >= 2"):
        RowFormat(1, "wide_rowwise_adam")


def test_names_parse_back_and_meta_without_a_state_dtype_is_fp32_state() -> None:
    for name in (
        "adam/fp16",
        "adam/int8/log8",
        "sgd/int8",
        "rowwise_adagrad/bf16/log8",
        "partial_rowwise_adam/int8s/log8",
    ):
        fmt = RowFormat.parse(16, name)
        assert fmt.name == name and RowFormat.from_meta(fmt.meta()) == fmt
    assert RowFormat.parse(16, "adam/fp16/fp32").name == "adam/fp16"
    assert "state_dtype" not in RowFormat(16, "adam", "fp16").meta(), "files written before it name the same format"
    with pytest.raises(ValueError, match="optimizer/row_dtype"):
        RowFormat.parse(16, "adam")
    with pytest.raises(ValueError, match="log8"):
        RowFormat(16, "adam", "int8", "fp8")


def test_convert_to_int8_rows_and_log8_state_keeps_values_within_their_codes() -> None:
    src, dst = RowFormat(4, "adam", "fp32"), RowFormat(4, "adam", "int8", "log8")
    gen = torch.Generator().manual_seed(0)
    rows = src.fresh(torch.randn(50, 4, generator=gen))
    rows.state = {"m": torch.randn(50, 4, generator=gen) * 1e-3, "v": torch.rand(50, 4, generator=gen) * 1e-5}
    rows.clock[:] = 7
    out = dst.convert(rows, src)
    dst.check(out)
    assert out.emb.dtype == torch.uint8 and out.emb.shape == (50, 8) and out.state["v"].dtype == torch.uint8
    span = (rows.emb.amax(1) - rows.emb.amin(1))[:, None]
    assert ((dst.weights(out.emb) - rows.emb).abs() <= span / 255 * 0.51).all()
    values = dst.state_values(out.state)
    for name in ("m", "v"):
        assert ((values[name] - rows.state[name]).abs() <= 0.091 * rows.state[name].abs()).all(), name
    back = src.convert(out, dst)
    assert torch.equal(back.emb, dst.weights(out.emb)) and torch.equal(back.state["v"], values["v"])


def test_fp16_rows_with_rowwise_adagrad_make_a_48_byte_record_where_fp32_adam_took_208() -> None:
    compact = RecordLayout.of(RowFormat(16, "rowwise_adagrad", "fp16"))
    assert compact.record_bytes == 48 and compact.rows_per_unit == 85  # key 8 + clock 4 + 16 x fp16 + acc 4
    adam = RecordLayout.of(RowFormat(16, "adam", "fp32"))
    assert adam.record_bytes == 204 and adam.rows_per_unit == 20  # 3 x 64 + clock 4 + key 8 (the int64 clock was 208)
    assert RowFormat(16, "rowwise_adagrad", "bf16").row_bytes() == 40
    assert RowFormat(16, "sgd", "fp16").row_bytes() == 36
    assert RowFormat(16, "adam", "fp32").row_bytes() == 196


def test_unknown_names_are_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="rowwise_adagrad"):
        RowFormat(4, "adagrad")
    with pytest.raises(ValueError, match="bf16"):
        RowFormat(4, "adam", "fp8")
    with pytest.raises(ValueError, match="dim"):
        RowFormat(0)


def test_a_small_step_survives_in_fp16_where_round_to_nearest_loses_it() -> None:
    """Steps of a fifth of a unit in the last place: round-to-nearest never moves the row, stochastic rounding
    moves it by the steps' sum on average."""
    fmt = RowFormat(1, "sgd", "fp16")
    n, steps = 2000, 50
    rows = fmt.fresh(torch.ones(n, 1))
    ulp = 2.0**-10  # fp16 spacing in [1, 2)
    g = torch.full((n, 1), -ulp / 5)
    keys = torch.arange(n)
    for _ in range(steps):
        rows = fmt.step(keys, rows, g, lr=1.0)
    moved = rows.emb.float().mean() - 1.0
    assert abs(float(moved) - steps * ulp / 5) < 0.1 * steps * ulp / 5
    assert (torch.ones(1).half() + torch.tensor(ulp / 5).half()).item() == 1.0


def test_adam_state_becomes_an_adagrad_accumulator_of_the_squared_gradients_so_far() -> None:
    adam, ada = get_optimizer("adam"), get_optimizer("rowwise_adagrad")
    g2 = torch.tensor([[1.0, 3.0], [4.0, 4.0]])  # constant squared gradients per element
    clock = torch.tensor([10, 0], dtype=torch.int32)
    b2 = ADAM_BETAS[1]
    v = g2 * (1 - b2**10)  # Adam's second moment after 10 steps of those gradients
    state = convert_state(adam, ada, {"m": torch.zeros(2, 2), "v": v}, clock, 2)
    np.testing.assert_allclose(state["acc"].numpy(), [10 * 2.0, 0.0], rtol=1e-5)  # a never-updated row: 0
    back = convert_state(ada, adam, {"acc": torch.tensor([20.0, 0.0])}, clock, 2)
    np.testing.assert_allclose(back["v"][0].numpy() / (1 - b2**10), [2.0, 2.0], rtol=1e-5)
    assert not back["m"].any() and not back["v"][1].any()
    assert convert_state(adam, get_optimizer("sgd"), {"m": v, "v": v}, clock, 2) == {}
    zero = convert_state(get_optimizer("sgd"), ada, {}, clock, 2)
    assert torch.equal(zero["acc"], torch.zeros(2))


def test_partial_rowwise_adam_keeps_adams_momentum_and_the_row_mean_of_its_second_moment() -> None:
    adam, part = get_optimizer("adam"), get_optimizer("partial_rowwise_adam")
    m, v = torch.tensor([[0.1, -0.2], [0.0, 0.0]]), torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    clock = torch.tensor([10, 0], dtype=torch.int32)
    state = convert_state(adam, part, {"m": m, "v": v}, clock, 2)
    assert torch.equal(state["m"], m) and state["v"].tolist() == [2.0, 0.0]
    back = convert_state(part, adam, state, clock, 2)
    assert torch.equal(back["m"], m) and back["v"].tolist() == [[2.0, 2.0], [0.0, 0.0]]
    from_rms = convert_state(get_optimizer("rmsprop"), part, {"v": v}, clock, 2)
    assert not from_rms["m"].any() and from_rms["v"].tolist() == [2.0, 0.0]
    ada = convert_state(part, get_optimizer("rowwise_adagrad"), state, clock, 2)
    np.testing.assert_allclose(ada["acc"].numpy(), [10 * 2.0 / (1 - ADAM_BETAS[1] ** 10), 0.0], rtol=1e-5)


def test_partial_rowwise_adam_steps_each_element_by_its_momentum_over_the_rows_rms_gradient() -> None:
    """First step from zero state: m^ = g and v^ = mean(g^2), so the row moves by lr * g / rms(g)."""
    g = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    emb, state = get_optimizer("partial_rowwise_adam").step(
        torch.zeros(2, 2),
        {"m": torch.zeros(2, 2), "v": torch.zeros(2)},
        torch.ones(2, dtype=torch.int32),
        g,
        lr=0.1,
        weight_decay=0.0,
    )
    rms = (12.5) ** 0.5
    np.testing.assert_allclose(emb[0].numpy(), [-0.1 * 3 / rms, -0.1 * 4 / rms], rtol=1e-5)
    assert emb[1].tolist() == [0.0, 0.0] and state["v"].shape == (2,)


def test_wide_rowwise_adam_normalises_column_0_apart_from_the_rest() -> None:
    """Column 0 is the key's wide weight: its own v, so a large wide gradient does not shrink the deep columns'
    steps (nor they its step).  First step from zero state: each group moves by lr * g / rms(g over the group)."""
    g = torch.tensor([[30.0, 3.0, 4.0]])
    emb, state = get_optimizer("wide_rowwise_adam").step(
        torch.zeros(1, 3),
        {"m": torch.zeros(1, 3), "v": torch.zeros(1, 2)},
        torch.ones(1, dtype=torch.int32),
        g,
        lr=0.1,
        weight_decay=0.0,
    )
    rms = (12.5) ** 0.5
    np.testing.assert_allclose(emb[0].numpy(), [-0.1, -0.1 * 3 / rms, -0.1 * 4 / rms], rtol=1e-5)
    assert state["v"].shape == (1, 2)
    adam = get_optimizer("adam")
    clock = torch.tensor([3], dtype=torch.int32)
    to_adam = convert_state(
        get_optimizer("wide_rowwise_adam"), adam, {"m": g, "v": torch.tensor([[9.0, 2.0]])}, clock, 3
    )
    assert to_adam["v"].tolist() == [[9.0, 2.0, 2.0]] and torch.equal(to_adam["m"], g)
    back = convert_state(
        adam, get_optimizer("wide_rowwise_adam"), {"m": g, "v": torch.tensor([[9.0, 1.0, 3.0]])}, clock, 3
    )
    assert back["v"].tolist() == [[9.0, 2.0]]


def test_convert_casts_weights_to_nearest_and_keeps_clocks() -> None:
    src, dst = RowFormat(2, "adam", "fp32"), RowFormat(2, "rowwise_adagrad", "bf16")
    rows = src.fresh(torch.tensor([[0.1, -0.3], [1.0, 2.0]]))
    rows.clock[:] = torch.tensor([3, 0], dtype=torch.int32)
    out = dst.convert(rows, src)
    assert out.emb.dtype == torch.bfloat16 and torch.equal(out.emb, rows.emb.to(torch.bfloat16))
    assert out.clock.tolist() == [3, 0] and set(out.state) == {"acc"}
    assert dst.convert(out, dst) is out


def test_the_contract_suite_runs_every_rule_row_dtype_and_state_dtype() -> None:
    """A new optimizer or dtype must join `FORMATS`, or no tier is checked with it."""
    assert {f.optimizer for f in FORMATS} == set(OPTIMIZERS)
    assert {f.row_dtype for f in FORMATS} == set(ROW_DTYPES)
    assert {f.state_dtype for f in FORMATS} == set(STATE_DTYPES)


@pytest.mark.parametrize(
    "fmt", [RowFormat(DIM, o, d) for o in ("adam", "rowwise_adagrad") for d in ("fp32", "fp16")], ids=lambda f: f.name
)
def test_step_refuses_non_finite_gradients_without_a_separate_check(fmt: RowFormat) -> None:
    """What a GPU tier relies on when it skips `check_grads`' finiteness read: the same error, nothing changed."""
    rows = fmt.fresh(torch.ones(3, DIM))
    keys = torch.arange(3)
    for bad, match in (
        (float("nan"), "grads contain NaN or inf"),
        (float("inf"), "grads contain NaN or inf"),
        (1e30, "would make 1 row"),
    ):
        grads = torch.ones(3, DIM)
        grads[1, 0] = bad
        with pytest.raises(ValueError, match=match):
            fmt.step(keys, rows, grads, lr=0.1)
    assert torch.equal(rows.emb.float(), torch.ones(3, DIM)) and int(rows.clock.sum()) == 0
