"""`RowFormat`: what one stored row holds (width, weight dtype, optimizer state) and how it is updated.

Every tier, the SSD record, snapshots and the HET cache take their row layout from one `RowFormat`:

- `emb`: the weights, in `row_dtype` (`fp32`, `fp16` or `bf16`; `store.row_dtype`);
- the state of the sparse optimizer (`storage.embedding.sparse_optim`; `optim.sparse_optimizer`), fp32;
- `clock`: int32, the updates applied to the row (HET's staleness clock and Adam's bias correction).

An update reads the weights as fp32, steps them in fp32 and writes them back with stochastic rounding
(`round_to`): a step smaller than half a unit in the last place would be lost to round-to-nearest every
time (fp16 keeps 11 bits), while stochastic rounding keeps it in expectation.  The random bits come
from a hash of (key, clock, column), not from a generator: the same update rounds the same way in any
tier, in any batch order and after a crash and resume, with no state to save.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from storage.embedding.rows import Rows
from storage.embedding.sparse_optim import SparseOptimizer, convert_state, get_optimizer

ROW_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""`store.row_dtype` name -> torch dtype of the stored weights."""
CLOCK_DTYPE = torch.int32
CLOCK_MAX = torch.iinfo(CLOCK_DTYPE).max
"""A clock stops here (2^31 - 1 updates of one row; a row updated every step of 1,000 steps a second takes 25 days)."""


@dataclass(frozen=True)
class RowFormat:
    """The stored form of rows of width `dim`: weights in `row_dtype`, state of `optimizer`, an int32 clock.

    Args:
        dim: row width.
        optimizer: `optim.sparse_optimizer` (`rowwise_adagrad`, `adam`, `sgd`).
        row_dtype: `store.row_dtype` (`fp32`, `fp16`, `bf16`).
    """

    dim: int
    optimizer: str = "adam"
    row_dtype: str = "fp32"
    rule: SparseOptimizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.row_dtype not in ROW_DTYPES:
            raise ValueError(f"unknown row dtype {self.row_dtype!r}; store.row_dtype is one of {sorted(ROW_DTYPES)}")
        object.__setattr__(self, "rule", get_optimizer(self.optimizer))

    @property
    def dtype(self) -> torch.dtype:
        """Torch dtype of the stored weights."""
        return ROW_DTYPES[self.row_dtype]

    @property
    def name(self) -> str:
        """`optimizer/row_dtype`, e.g. `rowwise_adagrad/fp16` (messages and records)."""
        return f"{self.optimizer}/{self.row_dtype}"

    def meta(self) -> dict[str, Any]:
        """The fields that name the format in meta.json and snapshot metadata."""
        return {"dim": self.dim, "optimizer": self.optimizer, "row_dtype": self.row_dtype}

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.rule.state)

    def row_bytes(self) -> int:
        """Payload bytes of one row: weights, optimizer state and clock (the key and index not included)."""
        return self.dim * self.dtype.itemsize + self.rule.state_bytes(self.dim) + CLOCK_DTYPE.itemsize

    # ---- rows ----------------------------------------------------------------------------------
    def empty(self, n: int, device: torch.device | str = "cpu") -> Rows:
        """N zero rows (zero weights, state and clocks)."""
        return Rows(
            torch.zeros((n, self.dim), dtype=self.dtype, device=device),
            {f.name: torch.zeros(f.shape(n, self.dim), device=device) for f in self.rule.state},
            torch.zeros(n, dtype=CLOCK_DTYPE, device=device),
        )

    def fresh(self, emb: torch.Tensor) -> Rows:
        """Never-updated rows with fp32 weights `emb` (rounded to nearest in the row dtype), zero state, clock 0."""
        n, dev = emb.shape[0], emb.device
        return Rows(
            emb.to(self.dtype),
            {f.name: torch.zeros(f.shape(n, self.dim), device=dev) for f in self.rule.state},
            torch.zeros(n, dtype=CLOCK_DTYPE, device=dev),
        )

    def check(self, rows: Rows, what: str = "rows") -> None:
        """Raise `ValueError` unless `rows` have this format's tensors (names, dtypes, widths)."""
        if rows.emb.dtype != self.dtype or rows.emb.shape[1:] != (self.dim,):
            raise ValueError(f"{what}: weights are {rows.emb.dtype} of width {tuple(rows.emb.shape[1:])}, "
                             f"the store keeps {self.dtype} of width {self.dim} ({self.name})")
        if set(rows.state) != set(self.state_names):
            raise ValueError(f"{what} carry optimizer state {sorted(rows.state)}, the store's optimizer "
                             f"{self.optimizer!r} keeps {sorted(self.state_names)}")

    def step(self, keys: torch.Tensor, rows: Rows, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0) -> Rows:
        """One optimizer step on `rows` of `keys` (same device, one fp32 gradient per row); new tensors.

        Raises:
            ValueError: a gradient is NaN or inf, or the new rows would not be finite (no row is returned).
        """
        clock = (rows.clock.to(torch.int64) + 1).clamp_(max=CLOCK_MAX)
        emb32, state = self.rule.step(rows.emb.float(), rows.state, clock, grads, lr=lr, weight_decay=weight_decay)
        emb = round_to(emb32, self.dtype, keys, clock)
        # One reduction, one host read for the update: a NaN or inf gradient makes the rows non-finite
        # (or the state, for sgd through the weights), so the new rows' check covers the gradients too
        # (the tiers on a GPU skip `check_grads`' own).
        sums = [emb.float().sum(), *(s.sum() for s in state.values())]
        if not bool(torch.isfinite(torch.stack(sums)).all()):
            if not bool(torch.isfinite(grads).all()):
                raise ValueError("grads contain NaN or inf; no row was changed")
            bad = ~torch.isfinite(emb.float()).all(dim=1)
            for s in state.values():
                bad |= ~torch.isfinite(s.reshape(s.shape[0], -1)).all(dim=1)
            raise ValueError(
                f"the {self.optimizer} step would make {int(bad.sum())} row(s) non-finite in {self.row_dtype} "
                f"(largest |grad| {float(grads.abs().max()):.3g}); no row was changed; clip the gradients"
                + ("" if self.row_dtype == "fp32" else " or use store.row_dtype=fp32/bf16 (fp16 ends at 65504)")
            )
        return Rows(emb, state, clock.to(CLOCK_DTYPE))

    def convert(self, rows: Rows, src: RowFormat) -> Rows:
        """`rows` stored in format `src` as rows of this format (`sparse_optim.convert_state`; weights cast
        to nearest).  Rows already in this format come back as they are."""
        if src == self:
            return rows
        if src.dim != self.dim:
            raise ValueError(f"rows of width {src.dim} cannot become rows of width {self.dim}")
        state = convert_state(src.rule, self.rule, rows.state, rows.clock, self.dim)
        return Rows(rows.emb.float().to(self.dtype), state, rows.clock.to(CLOCK_DTYPE))


# ---- stochastic rounding -----------------------------------------------------------------------------
_MIX = (-7046029254386353131, -4658895280553007687, -7723592293110705685)  # odd 64-bit constants (wrap in int64)


def uniform_bits(keys: torch.Tensor, clock: torch.Tensor, dim: int) -> torch.Tensor:
    """(N, dim) floats in [0, 1) that depend only on (key, clock, column): the rounding noise of an update."""
    x = keys.to(torch.int64)[:, None] * _MIX[0] + clock.to(torch.int64)[:, None] * _MIX[1]
    x = x + torch.arange(dim, dtype=torch.int64, device=keys.device)[None, :] * _MIX[2]
    for _ in range(2):
        x = x ^ ((x >> 31) & 0x1FFFFFFFF)
        x = x * _MIX[0]
    return ((x >> 40) & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))


def round_to(x: torch.Tensor, dtype: torch.dtype, keys: torch.Tensor, clock: torch.Tensor) -> torch.Tensor:
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
    u = uniform_bits(keys.to(x.device), clock.to(x.device), x.shape[1])
    return torch.where((u < p) & (nf != x), other_bits, bits).view(dtype)

