"""8-bit codes: int8 rows with a per-row fp16 scale and offset, symmetric int8 rows with one scale, and log8
optimizer state; all unbiased under stochastic rounding, all exact where the value is on the grid."""

from __future__ import annotations

import pytest
import torch

from storage.embedding.rows.quantize import (
    decode_int8_rows,
    decode_int8s_rows,
    decode_log8,
    encode_int8_rows,
    encode_int8s_rows,
    encode_log8,
)


def _half(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, 0.5)


def test_an_int8_row_is_its_codes_then_an_fp16_scale_and_offset() -> None:
    x = torch.tensor([[0.0, 1.0, 2.0, 0.5], [-3.0, -3.0, -3.0, -3.0]])
    b = encode_int8_rows(x, _half(x))
    assert b.dtype == torch.uint8 and b.shape == (2, 8)
    scale, offset = b[:, 4:].contiguous().view(torch.float16).float().unbind(1)
    assert offset.tolist() == [0.0, -3.0]
    assert b[0, :4].tolist() == [0, 127, 255, 64]  # scale 2/255 rounded up to fp16
    assert float(scale[0]) * 255 >= 2.0 and float(scale[1]) == 0.0
    assert decode_int8_rows(b)[1].tolist() == [-3.0] * 4, "a constant row is exact"
    assert decode_int8_rows(b[:0]).shape == (0, 4)


def test_int8_rounding_to_nearest_is_within_half_a_step_of_the_rows_range() -> None:
    x = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0)) * 0.05
    err = (decode_int8_rows(encode_int8_rows(x, _half(x))) - x).abs()
    step = (x.amax(1) - x.amin(1)) / 255
    assert (err <= 0.5 * step[:, None] * 1.01 + 1e-6).all()
    lo = decode_int8_rows(encode_int8_rows(x, _half(x))).amin(1)
    assert (lo <= x.amin(1)).all(), "the offset never sits above the row's minimum (no code below 0 needed)"


def test_int8_stochastic_rounding_is_unbiased() -> None:
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(1)).expand(20_000, 16).contiguous()
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(2))
    mean = decode_int8_rows(encode_int8_rows(x, u)).double().mean(0)
    step = float(x[0].max() - x[0].min()) / 255
    assert (mean - x[0].double()).abs().max() < 0.02 * step


def test_a_symmetric_int8_row_is_its_codes_around_128_then_an_fp16_scale() -> None:
    top = 127 / 128  # scale 1/128, exact in fp16
    x = torch.tensor([[0.0, top, -top, 0.5], [0.0, 0.0, 0.0, 0.0], [-2.0, -2.0, -2.0, -2.0]])
    b = encode_int8s_rows(x, _half(x))
    assert b.dtype == torch.uint8 and b.shape == (3, 6)
    scale = b[:, 4:].contiguous().view(torch.float16).float()[:, 0]
    assert float(scale[0]) == 1 / 128 and float(scale[1]) == 0.0
    assert b[0, :4].tolist() == [128, 255, 1, 192]  # zero is code 128; the largest magnitude fits in 1 and 255
    assert decode_int8s_rows(b)[1].tolist() == [0.0] * 4 and decode_int8s_rows(b)[0, 0] == 0.0, "zero is exact"
    assert torch.allclose(decode_int8s_rows(b)[2], torch.full((4,), -2.0), rtol=1e-3), "a constant row: code 1"
    assert decode_int8s_rows(b[:0]).shape == (0, 4)


def test_symmetric_int8_rounding_to_nearest_is_within_half_a_step_of_the_rows_magnitude() -> None:
    x = torch.randn(2000, 16, generator=torch.Generator().manual_seed(0)) * 0.05
    err = (decode_int8s_rows(encode_int8s_rows(x, _half(x))) - x).abs()
    step = x.abs().amax(1) / 127
    assert (err <= 0.5 * step[:, None] * 1.01 + 1e-6).all()


def test_symmetric_int8_stochastic_rounding_is_unbiased() -> None:
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(1)).expand(20_000, 16).contiguous()
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(2))
    mean = decode_int8s_rows(encode_int8s_rows(x, u)).double().mean(0)
    step = float(x[0].abs().max()) / 127
    assert (mean - x[0].double()).abs().max() < 0.02 * step


@pytest.mark.parametrize("signed", [False, True])
def test_log8_codes_hold_any_magnitude_within_9_percent(signed: bool) -> None:
    mag = torch.logspace(-14, 4, 500, base=2.0 ** (1 / 0.30103)).float()  # 1e-14 .. 1e4 (within both grids' range)
    mag = mag[(mag > 2.0**-24.5) & (mag < 2.0**6.5)] if signed else mag[(mag > 2.0**-49.5) & (mag < 2.0**13.5)]
    x = mag * (torch.where(torch.arange(mag.numel()) % 2 == 0, 1.0, -1.0) if signed else 1.0)
    c = encode_log8(x, _half(x), signed=signed)
    assert c.dtype == torch.uint8
    back = decode_log8(c, signed=signed)
    assert (torch.sign(back) == torch.sign(x)).all()
    assert ((back - x).abs() / x.abs()).max() < 0.091  # half a step of 2^(1/4)
    zero = torch.zeros(3)
    assert decode_log8(encode_log8(zero, _half(zero), signed=signed), signed=signed).tolist() == [0.0] * 3


@pytest.mark.parametrize("value", [3e-3, 1e-17])
def test_log8_stochastic_rounding_keeps_the_mean_on_and_below_the_grid(value: float) -> None:
    """On the grid the error is that of rounding in log space (a fraction of a percent); below the smallest
    code (2^-49.75) the code is 0 or the smallest value in proportion, so a tiny second moment is kept on average."""
    x = torch.full((200_000,), value)
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(3))
    mean = float(decode_log8(encode_log8(x, u, signed=False), signed=False).double().mean())
    assert abs(mean / value - 1) < 0.03


def test_log8_saturates_at_the_ends_of_its_grid_instead_of_wrapping() -> None:
    x = torch.tensor([1e30, -1e30])
    assert decode_log8(encode_log8(x[:1], _half(x[:1]), signed=False), signed=False).item() == pytest.approx(2**13.75)
    assert decode_log8(encode_log8(x, _half(x), signed=True), signed=True).tolist() == pytest.approx(
        [2**6.75, -(2**6.75)]
    )
