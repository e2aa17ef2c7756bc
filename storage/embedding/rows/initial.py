"""Deterministic initial embedding rows: a pure function of the key.

Every tier, rank, machine and rerun must agree on the row of a key it has never
seen, without any shared RNG state, so the initial row is derived from the key
alone:

    seed_k   = splitmix64(key)
    h_kj     = splitmix64(seed_k + j * GAMMA)          j = 0 .. dim-1   (the splitmix64 stream of seed_k)
    u1, u2   = ((h >> 32) + 1) / 2^32, (h & 0xffffffff) / 2^32          u1 in (0, 1], u2 in [0, 1)
    row[k,j] = std * sqrt(-2 ln u1) * cos(2 pi u2)                       (Box-Muller, float64, then float32)

Integer arithmetic is done in torch int64, which wraps modulo 2^64 like the
uint64 arithmetic of a NumPy reference (in the tests), with
logical right shifts emulated by masking.  The transcendental part is computed
in float64 on the CPU whatever the keys' device, then rounded to float32, so the
result does not depend on the accelerator.
"""

from __future__ import annotations

import numpy as np
import torch

_GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_TWO_PI = 2.0 * np.pi
_INV_2_32 = 1.0 / 4294967296.0


def _signed(x: int) -> int:
    """The int64 with the same bits as the uint64 `x`."""
    return x - (1 << 64) if x >= (1 << 63) else x


def _xorshift_(z: torch.Tensor, k: int, tmp: torch.Tensor) -> None:
    """z ^= z >>> k (a logical shift: torch's `>>` is arithmetic, so the sign bits are masked off),
    in place (`tmp`: scratch of z's shape).  In-place ops avoid a fresh
    allocation per step, which dominates on CPU for large batches."""
    torch.bitwise_right_shift(z, k, out=tmp)
    tmp.bitwise_and_((1 << (64 - k)) - 1)
    z.bitwise_xor_(tmp)


def _splitmix64_(z: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    z.add_(_signed(_GAMMA))
    _xorshift_(z, 30, tmp)
    z.mul_(_signed(_M1))
    _xorshift_(z, 27, tmp)
    z.mul_(_signed(_M2))
    _xorshift_(z, 31, tmp)
    return z


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser of `x + GAMMA` on int64 tensors (bits as uint64, wrapping)."""
    z = x.clone()
    return _splitmix64_(z, torch.empty_like(z))


def init_rows(keys: torch.Tensor, dim: int, std: float) -> torch.Tensor:
    """Initial rows of `keys`: N(0, std^2) values that depend only on the key and the column.

    Args:
        keys: int64 tensor of shape (N,), any device; duplicates allowed.
        dim: row width (>= 1).  Column j of a key is the same for every dim > j.
        std: standard deviation (> 0).

    Returns:
        float32 tensor (N, dim) on the device of `keys`.

    Raises:
        TypeError: `keys` is not an int64 tensor.
        ValueError: bad shape, dim or std.
    """
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64:
        raise TypeError(f"keys must be an int64 torch.Tensor, got {getattr(keys, 'dtype', type(keys))}")
    if keys.dim() != 1:
        raise ValueError(f"keys must be 1-D, got shape {tuple(keys.shape)}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not std > 0:
        raise ValueError(f"std must be > 0, got {std}")
    device = keys.device
    seed = splitmix64(keys.detach().to("cpu"))
    steps = torch.arange(dim, dtype=torch.int64) * _signed(_GAMMA)
    h = seed[:, None] + steps[None, :]  # (N, dim)
    tmp = torch.empty_like(h)
    _splitmix64_(h, tmp)
    torch.bitwise_right_shift(h, 32, out=tmp)
    tmp.bitwise_and_(0xFFFFFFFF)
    u1 = tmp.to(torch.float64).add_(1.0).mul_(_INV_2_32)  # (0, 1]
    h.bitwise_and_(0xFFFFFFFF)
    u2 = h.to(torch.float64).mul_(_INV_2_32 * _TWO_PI)  # 2 pi u2
    del h, tmp
    r = u1.log_().mul_(-2.0).sqrt_()
    z = r.mul_(u2.cos_()).mul_(std)
    return z.to(torch.float32).to(device)
