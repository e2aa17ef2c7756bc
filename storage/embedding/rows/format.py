"""`RowFormat`: what one stored row holds (width, weight dtype, optimizer state) and how it is updated.

Every tier, the SSD record, snapshots and the HET cache take their row layout from one `RowFormat`:

- `emb`: the weights, in `row_dtype` (`store.row_dtype`): `fp32`, `fp16`, `bf16`, `int8` (`dim`
  codes + fp16 scale and offset per row, `storage.embedding.rows.quantize`) or `int8s` (`dim` codes + one fp16
  scale: symmetric around zero);
- the state of the sparse optimizer (`storage.embedding.rows.sparse_optim`; `optim.sparse_optimizer`) in
  `state_dtype` (`store.state_dtype`): `fp32`, or `log8` (one byte per value on a log grid);
- `clock`: int32, the updates applied to the row (HET's staleness clock and Adam's bias correction).

An update decodes the weights and state to fp32, steps them in fp32 and writes them back with
stochastic rounding (`storage.embedding.rows.rounding`, `quantize`), so a step too small for the row dtype
is kept in expectation instead of lost to round-to-nearest, the same way in any tier and after a resume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from storage.embedding.rows.batch import Rows
from storage.embedding.rows.quantize import (
    INT8_EXTRA,
    INT8S_EXTRA,
    decode_int8_rows,
    decode_int8s_rows,
    decode_log8,
    encode_int8_rows,
    encode_int8s_rows,
    encode_log8,
)
from storage.embedding.rows.rounding import round_to, uniform_bits
from storage.embedding.rows.sparse_optim import SparseOptimizer, convert_state, get_optimizer

ROW_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "int8": torch.uint8,
    "int8s": torch.uint8,
}
"""`store.row_dtype` name -> torch dtype of the stored weights (`int8`: uint8 codes, scale and offset; `int8s`:
uint8 codes and a scale)."""
_CODED = {
    "int8": (INT8_EXTRA, encode_int8_rows, decode_int8_rows),
    "int8s": (INT8S_EXTRA, encode_int8s_rows, decode_int8s_rows),
}
"""8-bit row dtypes -> (bytes after the codes, encode, decode) (`storage.embedding.rows.quantize`)."""
STATE_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "log8": torch.uint8}
"""`store.state_dtype` name -> torch dtype of the stored optimizer state."""

CLOCK_DTYPE = torch.int32
CLOCK_MAX = torch.iinfo(CLOCK_DTYPE).max
"""A clock stops here (2^31 - 1 updates of one row; a row updated every step of 1,000 steps a second takes 25 days)."""


@dataclass(frozen=True)
class RowFormat:
    """The stored form of rows of width `dim`: weights in `row_dtype`, state of `optimizer` in
    `state_dtype`, an int32 clock.

    Args:
        dim: row width.
        optimizer: `optim.sparse_optimizer` (`adam`, `wide_rowwise_adam`, `partial_rowwise_adam`, `rmsprop`,
            `rowwise_adagrad`, `sgd`).
        row_dtype: `store.row_dtype` (`fp32`, `fp16`, `bf16`, `int8`, `int8s`).
        state_dtype: `store.state_dtype` (`fp32`, `log8`).
        seed: `optim.seed`, mixed into the noise of the stochastic rounding of a step (`rounding.uniform_bits`).
            Not part of the layout: formats that differ only in it compare equal (a snapshot or an SSD record of
            one is read by the other as it is).
    """

    dim: int
    optimizer: str = "adam"
    row_dtype: str = "fp32"
    state_dtype: str = "fp32"
    seed: int = field(default=0, kw_only=True, compare=False)
    rule: SparseOptimizer = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")
        if self.row_dtype not in ROW_DTYPES:
            raise ValueError(f"unknown row dtype {self.row_dtype!r}; store.row_dtype is one of {sorted(ROW_DTYPES)}")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(
                f"unknown state dtype {self.state_dtype!r}; store.state_dtype is one of {sorted(STATE_DTYPES)}"
            )
        object.__setattr__(self, "rule", get_optimizer(self.optimizer))
        if any(f.columns > self.dim for f in self.rule.state):
            raise ValueError(
                f"optimizer {self.optimizer!r} keeps a second moment for column 0 and one for the "
                f"others: it needs embedding_dim >= 2, got {self.dim}"
            )

    @staticmethod
    def parse(dim: int, name: str) -> RowFormat:
        """The format called `name` (`optimizer/row_dtype[/state_dtype]`, as `name` writes it)."""
        parts = name.split("/")
        if len(parts) not in (2, 3):
            raise ValueError(f"a row format is optimizer/row_dtype[/state_dtype], e.g. adam/int8/log8; got {name!r}")
        return RowFormat(dim, *parts)

    @property
    def dtype(self) -> torch.dtype:
        """Torch dtype of the stored weights."""
        return ROW_DTYPES[self.row_dtype]

    @property
    def state_torch_dtype(self) -> torch.dtype:
        """Torch dtype of the stored optimizer state."""
        return STATE_DTYPES[self.state_dtype]

    @property
    def coded(self) -> bool:
        """Whether the weights are 8-bit codes with a per-row scale (`int8`, `int8s`), not floats."""
        return self.row_dtype in _CODED

    @property
    def width(self) -> int:
        """Elements of a stored weight row: `dim`, plus the scale (and offset) bytes of an 8-bit row."""
        return self.dim + (_CODED[self.row_dtype][0] if self.coded else 0)

    @property
    def name(self) -> str:
        """`optimizer/row_dtype`, with `/state_dtype` unless fp32, e.g. `adam/int8/log8` (messages and records)."""
        return f"{self.optimizer}/{self.row_dtype}" + ("" if self.state_dtype == "fp32" else f"/{self.state_dtype}")

    def meta(self) -> dict[str, Any]:
        """The fields that name the format in meta.json and snapshot metadata (`state_dtype` only when not
        fp32, so files written before it existed name the same format)."""
        m: dict[str, Any] = {"dim": self.dim, "optimizer": self.optimizer, "row_dtype": self.row_dtype}
        if self.state_dtype != "fp32":
            m["state_dtype"] = self.state_dtype
        return m

    @staticmethod
    def from_meta(m: dict[str, Any]) -> RowFormat:
        """The format `meta()` wrote (KeyError, TypeError or ValueError for anything else)."""
        return RowFormat(int(m["dim"]), str(m["optimizer"]), str(m["row_dtype"]), str(m.get("state_dtype", "fp32")))

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.rule.state)

    def row_bytes(self) -> int:
        """Payload bytes of one row: weights, optimizer state and clock (the key and index not included)."""
        state = sum(f.cols(self.dim) or 1 for f in self.rule.state)
        return self.width * self.dtype.itemsize + state * self.state_torch_dtype.itemsize + CLOCK_DTYPE.itemsize

    # ---- rows ----------------------------------------------------------------------------------
    def _zero_state(self, n: int, device: torch.device | str) -> dict[str, torch.Tensor]:
        return {
            f.name: torch.zeros(f.shape(n, self.dim), dtype=self.state_torch_dtype, device=device)
            for f in self.rule.state
        }

    def empty(self, n: int, device: torch.device | str = "cpu") -> Rows:
        """N zero rows (zero weights, state and clocks)."""
        return Rows(
            torch.zeros((n, self.width), dtype=self.dtype, device=device),
            self._zero_state(n, device),
            torch.zeros(n, dtype=CLOCK_DTYPE, device=device),
        )

    def fresh(self, emb: torch.Tensor) -> Rows:
        """Never-updated rows with fp32 weights `emb` (rounded to nearest in the row dtype), zero state, clock 0."""
        n, dev = emb.shape[0], emb.device
        return Rows(self.nearest(emb), self._zero_state(n, dev), torch.zeros(n, dtype=CLOCK_DTYPE, device=dev))

    def weights(self, emb: torch.Tensor) -> torch.Tensor:
        """Stored weights (N, width) as the fp32 rows they hold, (N, dim)."""
        return _CODED[self.row_dtype][2](emb) if self.coded else emb.float()

    def nearest(self, x: torch.Tensor) -> torch.Tensor:
        """fp32 rows (N, dim) as stored weights, rounded to nearest."""
        if self.coded:
            return _CODED[self.row_dtype][1](x, torch.full_like(x, 0.5))
        return x.to(self.dtype)

    def state_values(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Stored optimizer state as fp32 values."""
        if self.state_dtype == "fp32":
            return state
        return {f.name: decode_log8(state[f.name], signed=f.signed) for f in self.rule.state}

    def stored_state(
        self, state: dict[str, torch.Tensor], u: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """fp32 optimizer state in the stored dtype, rounded by the noise `u` per field (None: to nearest)."""
        if self.state_dtype == "fp32":
            return state
        return {
            f.name: encode_log8(
                state[f.name], torch.full_like(state[f.name], 0.5) if u is None else u[f.name], signed=f.signed
            )
            for f in self.rule.state
        }

    def check(self, rows: Rows, what: str = "rows") -> None:
        """Raise `ValueError` unless `rows` have this format's tensors (names, dtypes, widths)."""
        if rows.emb.dtype != self.dtype or rows.emb.shape[1:] != (self.width,):
            raise ValueError(
                f"{what}: weights are {rows.emb.dtype} of width {tuple(rows.emb.shape[1:])}, "
                f"the store keeps {self.dtype} of width {self.width} ({self.name})"
            )
        if set(rows.state) != set(self.state_names):
            raise ValueError(
                f"{what} carry optimizer state {sorted(rows.state)}, the store's optimizer "
                f"{self.optimizer!r} keeps {sorted(self.state_names)}"
            )
        for name, t in rows.state.items():
            if t.dtype != self.state_torch_dtype:
                raise ValueError(
                    f"{what}: optimizer state {name!r} is {t.dtype}, the store keeps "
                    f"{self.state_torch_dtype} ({self.name})"
                )

    def step(
        self, keys: torch.Tensor, rows: Rows, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0
    ) -> Rows:
        """One optimizer step on `rows` of `keys` (same device, one fp32 gradient per row); new tensors.

        Raises:
            ValueError: a gradient is NaN or inf, or the new rows would not be finite (no row is returned).
        """
        new, state32, finite = self._step(keys, rows, grads, lr=lr, weight_decay=weight_decay)
        # One reduction, one host read for the update: a NaN or inf gradient makes the rows non-finite
        # (or the state, for sgd through the weights), so the new rows' check covers the gradients too
        # (the tiers on a GPU skip `check_grads`' own, and this read: `step_unchecked`).
        if not bool(finite):
            if not bool(torch.isfinite(grads).all()):
                raise ValueError("grads contain NaN or inf; no row was changed")
            bad = ~torch.isfinite(self.weights(new.emb)).all(dim=1)
            for s in state32.values():
                bad |= ~torch.isfinite(s.reshape(s.shape[0], -1)).all(dim=1)
            raise ValueError(
                f"the {self.optimizer} step would make {int(bad.sum())} row(s) non-finite in {self.row_dtype} "
                f"(largest |grad| {float(grads.abs().max()):.3g}); no row was changed; clip the gradients"
                + (
                    ""
                    if self.row_dtype in ("fp32", "bf16")
                    else " or use store.row_dtype=fp32/bf16 (fp16, and an int8 row's fp16 scale, end at 65504)"
                )
            )
        return new

    def step_unchecked(
        self, keys: torch.Tensor, rows: Rows, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0
    ) -> tuple[Rows, torch.Tensor]:
        """`step` without its host read: the new rows, and whether every one is finite as a 0-dim bool tensor on
        their device.  A tier on a GPU keeps the old rows where it is False and reads it at its next check
        (`storage.embedding.caching_tier.CachingTier.check_updates`), so an update never waits for the GPU."""
        new, _, finite = self._step(keys, rows, grads, lr=lr, weight_decay=weight_decay)
        return new, finite

    def _step(
        self, keys: torch.Tensor, rows: Rows, grads: torch.Tensor, *, lr: float, weight_decay: float
    ) -> tuple[Rows, dict[str, torch.Tensor], torch.Tensor]:
        """(the new rows, their fp32 optimizer state, whether the new weights and state are all finite)."""
        clock = (rows.clock.to(torch.int64) + 1).clamp_(max=CLOCK_MAX)
        emb32, state32 = self.rule.step(
            self.weights(rows.emb), self.state_values(rows.state), clock, grads, lr=lr, weight_decay=weight_decay
        )
        if self.coded:
            emb = _CODED[self.row_dtype][1](emb32, uniform_bits(keys.to(emb32.device), clock, self.dim, seed=self.seed))
        else:
            emb = round_to(emb32, self.dtype, keys, clock, self.seed)
        noise = None
        if self.state_dtype != "fp32":
            k = keys.to(emb32.device)
            fields = enumerate(self.rule.state, start=1)  # stream 0 is the weights'
            noise = {
                f.name: uniform_bits(k, clock, self.dim, stream=i, seed=self.seed)[
                    :, : (f.cols(self.dim) or 1)
                ].reshape(f.shape(len(clock), self.dim))
                for i, f in fields
            }
        state = self.stored_state(state32, noise)
        sums = [self.weights(emb).sum(), *(s.sum() for s in state32.values())]
        return Rows(emb, state, clock.to(CLOCK_DTYPE)), state32, torch.isfinite(torch.stack(sums)).all()

    def convert(self, rows: Rows, src: RowFormat) -> Rows:
        """`rows` stored in format `src` as rows of this format (`sparse_optim.convert_state`; weights cast
        to nearest).  Rows already in this format come back as they are."""
        if src == self:
            return rows
        if src.dim != self.dim:
            raise ValueError(f"rows of width {src.dim} cannot become rows of width {self.dim}")
        state = convert_state(src.rule, self.rule, src.state_values(rows.state), rows.clock, self.dim)
        emb = rows.emb if src.row_dtype == self.row_dtype else self.nearest(src.weights(rows.emb))
        return Rows(emb, self.stored_state(state), rows.clock.to(CLOCK_DTYPE))
