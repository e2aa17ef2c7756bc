"""8-bit codes for stored rows: weights with a per-row scale and offset, optimizer state on a log grid.

Both are pure tensor functions; the noise `u` of a stochastic rounding is an argument (uniform in
[0, 1), `storage.embedding.rows.rounding.uniform_bits`), and `u = 0.5` everywhere rounds to nearest.

- **Weights** (`store.row_dtype=int8`): fbgemm's fused 8-bit row-wise layout, a row of `dim` codes
  followed by its scale and offset as two fp16 (`dim + 4` bytes): `w = code * scale + offset`, the
  offset the row's minimum and the scale its range / 255.  An update re-fits the row's range, so
  every element is re-rounded; stochastic rounding keeps each one unbiased.
- **Symmetric weights** (`store.row_dtype=int8s`): the per-row-scale 8-bit row the compact-rows issue names
  (fbgemm's FP8 rows keep one scale too): `dim` codes and one fp16 scale (`dim + 2` bytes), `w = (code - 128)
  * scale`, the scale the row's largest magnitude / 127.  Two bytes less than `int8`; a row whose values all
  share a sign uses half the codes (7 bits of its range instead of 8).
- **Optimizer state** (`store.state_dtype=log8`): one byte per value on a logarithmic grid, so a
  second moment that spans 2^-50..2^14 keeps ~9% relative resolution everywhere (a linear 8-bit code
  with a per-row scale would flush the small elements of a row to zero, and they are the ones whose
  step it divides).  Non-negative state (Adam's `v`, AdaGrad's accumulator): code 0 is zero, code c
  >= 1 is 2^((c - 200) / 4).  Signed state (Adam's `m`): bit 7 the sign, bits 0-6 the magnitude,
  0 is zero, c >= 1 is 2^((c - 100) / 4).  Below the smallest step the code rounds between zero and
  the smallest value in proportion, so tiny values are kept in expectation too.
"""

from __future__ import annotations

import torch

INT8_EXTRA = 4
"""Bytes after an int8 row's codes: its fp16 scale and fp16 offset."""
INT8S_EXTRA = 2
"""Bytes after a symmetric int8 row's codes: its fp16 scale."""
LOG8_STEPS = 4
"""Codes per octave of the stored value (8 per octave of sqrt(v), the quantity Adam divides by)."""
LOG8_TOP = 200
"""Unsigned codes: c = 200 is 1.0; the grid spans 2^-49.75 (c = 1) to 2^13.75 (c = 255)."""
SLOG8_TOP = 100
"""Signed codes: magnitude c = 100 is 1.0; the grid spans 2^-24.75 (c = 1) to 2^6.75 (c = 127)."""


def encode_int8_rows(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """fp32 rows (N, dim) as uint8 (N, dim + 4): codes, then fp16 scale and fp16 offset."""
    low = x.amin(dim=1, keepdim=True)
    lo = low.to(torch.float16)  # the offset, rounded down where fp16's nearest is above the row's minimum
    lo = torch.where(lo.float() > low, lo.nextafter(torch.full_like(lo, -torch.inf)), lo)
    span = x.amax(dim=1, keepdim=True) - lo.float()
    scale = (span / 255).to(torch.float16)
    # round the scale up, so that the row's maximum still fits in code 255
    up = scale.nextafter(torch.full_like(scale, torch.inf))  # a fill on the rows' device: no host copy
    scale = torch.where(scale.float() * 255 < span, up, scale)
    s = scale.float()
    z = torch.where(s > 0, (x - lo.float()) / torch.where(s > 0, s, 1.0), 0.0)
    codes = torch.floor(z + u).clamp_(0, 255).to(torch.uint8)
    tail = torch.cat([scale, lo], dim=1).view(torch.uint8)
    return torch.cat([codes, tail], dim=1)


def decode_int8_rows(b: torch.Tensor) -> torch.Tensor:
    """uint8 rows (N, dim + 4) as fp32 (N, dim)."""
    dim = b.shape[1] - INT8_EXTRA
    if b.shape[0] == 0:
        return torch.zeros((0, dim), device=b.device)
    sb = b[:, dim:].contiguous().view(torch.float16).float()  # (N, 2): scale, offset
    return b[:, :dim].float() * sb[:, :1] + sb[:, 1:]


def encode_int8s_rows(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """fp32 rows (N, dim) as uint8 (N, dim + 2): codes 1..255 (128 is zero), then the fp16 scale."""
    top = x.abs().amax(dim=1, keepdim=True)
    scale = (top / 127).to(torch.float16)
    # round the scale up, so that the row's largest magnitude still fits in code 1 or 255
    up = scale.nextafter(torch.full_like(scale, torch.inf))
    scale = torch.where(scale.float() * 127 < top, up, scale)
    s = scale.float()
    z = torch.where(s > 0, x / torch.where(s > 0, s, 1.0), 0.0)
    codes = (torch.floor(z + u).clamp_(-127, 127) + 128).to(torch.uint8)
    return torch.cat([codes, scale.view(torch.uint8)], dim=1)


def decode_int8s_rows(b: torch.Tensor) -> torch.Tensor:
    """uint8 rows (N, dim + 2) as fp32 (N, dim)."""
    dim = b.shape[1] - INT8S_EXTRA
    if b.shape[0] == 0:
        return torch.zeros((0, dim), device=b.device)
    scale = b[:, dim:].contiguous().view(torch.float16).float()  # (N, 1)
    return (b[:, :dim].float() - 128) * scale


def _log_code(a: torch.Tensor, u: torch.Tensor, top: int, last: int) -> torch.Tensor:
    """Codes 0..last of non-negative `a`: 0 is zero, c >= 1 is 2^((c - top) / LOG8_STEPS); rounded by `u`."""
    smallest = 2.0 ** ((1 - top) / LOG8_STEPS)
    pos = a > 0
    level = torch.log2(torch.where(pos, a, 1.0)) * LOG8_STEPS + top
    on_grid = torch.floor(level + u).clamp_(1, last)
    below = (u < a / smallest).to(on_grid.dtype)  # between zero and the smallest code, in proportion
    return torch.where(pos, torch.where(level < 1, below, on_grid), 0.0)


def _log_value(c: torch.Tensor, top: int) -> torch.Tensor:
    c = c.float()
    return torch.where(c > 0, torch.exp2((c - top) / LOG8_STEPS), 0.0)


def encode_log8(x: torch.Tensor, u: torch.Tensor, *, signed: bool) -> torch.Tensor:
    """fp32 state as uint8 log codes (see the module docstring); `signed` for state of either sign."""
    if not signed:
        return _log_code(x.clamp(min=0), u, LOG8_TOP, 255).to(torch.uint8)
    mag = _log_code(x.abs(), u, SLOG8_TOP, 127)
    return (mag + torch.where((x < 0) & (mag > 0), 128.0, 0.0)).to(torch.uint8)


def decode_log8(c: torch.Tensor, *, signed: bool) -> torch.Tensor:
    """uint8 log codes as fp32 state."""
    if not signed:
        return _log_value(c, LOG8_TOP)
    c = c.to(torch.int32)
    mag = _log_value(c & 127, SLOG8_TOP)
    return torch.where(c >= 128, -mag, mag)
