"""Stochastic rounding of fp32 rows to 16-bit floats, and the noise every stochastic rounding of a row uses.

An update steps rows in fp32 and stores them in the row dtype (`storage.embedding.rows.format.RowFormat.step`).
A step smaller than half a unit in the last place would be lost to round-to-nearest every time (fp16 keeps 11
bits); rounding to the neighbour above or below in proportion to closeness keeps it in expectation.  The random
bits come from a hash of (key, clock, column, stream, seed), not from a generator: the same update rounds the same
way in any tier, in any batch order and after a crash and resume, with no state to save, and a run with another
`optim.seed` rounds otherwise.  Seed 0 adds nothing to the hash: its bits are those of the runs before the seed
took part.  The 8-bit codes (`storage.embedding.rows.quantize`) take the same noise as an argument.
"""

from __future__ import annotations

import torch

_MIX = (-7046029254386353131, -4658895280553007687, -7723592293110705685)  # odd 64-bit constants (wrap in int64)
_M64 = (1 << 64) - 1


def seed_offset(seed: int) -> int:
    """What `seed` adds to the hash's input: splitmix64's finalizer of it, a bijection of 64-bit words that keeps 0
    at 0 and sends nearby seeds far apart (as an int64)."""
    z = seed & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return z - (1 << 64) if z >> 63 else z


def uniform_bits(keys: torch.Tensor, clock: torch.Tensor, dim: int, stream: int = 0, seed: int = 0) -> torch.Tensor:
    """(N, dim) floats in [0, 1) that depend only on (key, clock, column, stream, seed): the rounding noise of an
    update (stream 0 for the weights, 1, 2, ... for the optimizer state fields; seed: `optim.seed`)."""
    x = keys.to(torch.int64)[:, None] * _MIX[0] + clock.to(torch.int64)[:, None] * _MIX[1] + seed_offset(seed)
    col = torch.arange(dim, dtype=torch.int64, device=keys.device) + stream * dim
    x = x + col[None, :] * _MIX[2]
    for _ in range(2):
        x = x ^ ((x >> 31) & 0x1FFFFFFFF)
        x = x * _MIX[0]
    return ((x >> 40) & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))


def round_to(
    x: torch.Tensor, dtype: torch.dtype, keys: torch.Tensor, clock: torch.Tensor, seed: int = 0
) -> torch.Tensor:
    """fp32 `x` (N, dim) in `dtype`, rounded stochastically: to the neighbour above or below with probability
    proportional to closeness, so the rounding error is zero in expectation (noise: `uniform_bits`)."""
    if dtype == torch.float32:
        return x
    near = x.to(dtype)
    nf = near.float()
    bits = near.view(torch.int16)
    # the other neighbour of x: one unit of the 16-bit pattern away from `near`, away from or towards zero
    away = nf.abs() < x.abs()
    other_bits = bits + torch.where(away, 1, -1).to(torch.int16)
    other = other_bits.view(dtype).float()
    gap = (other - nf).abs()
    p = torch.where(gap > 0, (x - nf).abs() / gap, 0.0)
    u = uniform_bits(keys.to(x.device), clock.to(x.device), x.shape[1], seed=seed)
    return torch.where((u < p) & (nf != x), other_bits, bits).view(dtype)
