"""Small stores, reference optimisers and row comparisons for the embedding-store tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from storage.embedding.base import ADAM_BETAS, ADAM_EPS, EmbeddingStore
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.initial import init_rows
from storage.embedding.rows.sparse_optim import ADAGRAD_EPS
from storage.embedding.snapshot import read_snapshot
from storage.embedding.ssd.store import SsdStore

DIM = 8
STD = 0.05
FORMATS = [RowFormat(DIM, o, d) for o in ("adam", "rowwise_adagrad", "sgd") for d in ("bf16", "fp16", "fp32")] + [
    RowFormat(DIM, "adam", "int8", "log8"),
    RowFormat(DIM, "rmsprop", "int8", "log8"),
    RowFormat(DIM, "partial_rowwise_adam", "fp32"),
    RowFormat(DIM, "wide_rowwise_adam", "fp32"),
    RowFormat(DIM, "wide_rowwise_adam", "int8s", "log8"),
]
"""The formats the contract suite runs each tier with: each of three rules with each float row dtype and fp32 state,
the two per-element second-moment rules with int8 rows and log8 state (the 64- and 48-byte options), the two
row-wise Adams with fp32 rows and state, and the wide one with symmetric int8 rows and log8 state (48 bytes); the other
combinations are these parts put together (int8 rows, log8 state and each rule have their own unit tests)."""
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2, "int8": 3e-2, "int8s": 3e-2}
"""Relative tolerance of rows stored in a dtype against an fp32 oracle after a few steps (a few units in the
last place: fp16 keeps 11 significant bits, bf16 8; an int8 row 8 bits of its range, re-rounded at every step)."""
STATE_ATOL = {"fp32": 0.0, "log8": 3e-2}
"""Absolute tolerance added for optimizer state stored in a dtype: a log8 code holds a value within 9% (m) and
sqrt(v) within 4.5%, so each Adam step's size is off by up to ~10%: 0.03 over the oracle test's steps (lr <= 0.1)."""


def random_rows(fmt: RowFormat, n: int, gen: torch.Generator, *, clock_from: int = 1) -> Rows:
    """`n` rows of `fmt` with random weights and state (>= 0, as the second moments and accumulators are; Adam's
    first moment of either sign) and clocks counting from `clock_from`."""
    state = {f.name: torch.rand(f.shape(n, fmt.dim), generator=gen) for f in fmt.rule.state}
    if "m" in state:
        state["m"] = torch.randn(n, fmt.dim, generator=gen)
    return Rows(
        fmt.nearest(torch.randn(n, fmt.dim, generator=gen)),
        fmt.stored_state(state),
        torch.arange(n, dtype=torch.int32) + clock_from,
    )


def stored(x: torch.Tensor, fmt: RowFormat) -> torch.Tensor:
    """fp32 rows as a store of `fmt` keeps them before any update (rounded to nearest) and returns them."""
    return fmt.weights(fmt.nearest(x))


def keys_of(*ks: int) -> torch.Tensor:
    return torch.tensor(ks, dtype=torch.int64)


def all_rows(store: EmbeddingStore, url: str) -> dict[str, np.ndarray]:
    """Every row of `store`, via its snapshot, sorted by key: keys, emb (fp32), clock and each state tensor by name."""
    store.snapshot(url)
    snap = read_snapshot(url)
    order = np.argsort(snap.keys)
    out = {"keys": snap.keys[order], "emb": snap.emb[order], "clock": snap.clock[order]}
    out.update({k: v[order] for k, v in snap.state.items()})
    return out


def assert_same_rows(a: EmbeddingStore, b: EmbeddingStore, tmp_path: Path) -> None:
    """`a` and `b` hold exactly the same rows (keys, weights, optimizer state, clocks), bit for bit."""
    got, want = all_rows(a, str(tmp_path / "a.parquet")), all_rows(b, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def snapshot_arrays(url: str) -> tuple[np.ndarray, ...]:
    """(keys, emb, clock, then the state tensors by name) of a snapshot, sorted by key."""
    snap = read_snapshot(url)
    o = np.argsort(snap.keys)
    return (snap.keys[o], snap.emb[o], snap.clock[o], *(snap.state[k][o] for k in sorted(snap.state)))


def same_bytes(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def host_over_ssd(path: Path, rows: int = 20, fmt: RowFormat | int = DIM) -> HostStore:
    """A HostStore of `rows` rows over an SsdStore at `path`: small enough that rows spill in every test."""
    ssd = SsdStore(str(path), fmt, init_std=STD)
    return HostStore(fmt, budget_bytes=rows * host_row_bytes(fmt), below=ssd, init_std=STD)


def train_random(store: EmbeddingStore, steps: int, seed: int = 0) -> None:
    """`steps` updates of 32 random keys in [0, 100) with random gradients."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        store.update(torch.randint(0, 100, (32,), generator=gen), torch.randn(32, DIM, generator=gen), lr=0.05)


def fill_like_reference(store: EmbeddingStore, n: int, seed: int = 0) -> MemoryStore:
    """Three updates of `n` random keys in [0, 3n) applied to `store` and to a returned MemoryStore."""
    ref = MemoryStore(store.row_format, init_std=STD)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        keys = torch.randint(0, n * 3, (n,), generator=gen)
        grads = torch.randn(n, store.dim, generator=gen)
        store.update(keys, grads, lr=0.05)
        ref.update(keys, grads, lr=0.05)
    return ref


def assert_matches_oracle(store: EmbeddingStore, fmt: RowFormat) -> None:
    """Six updates of `store` (duplicate and untouched keys, two learning rates, weight decay on every other step)
    leave its rows within a few units in the last place of `fmt`'s row dtype (plus its state dtype's step error)
    of the oracle of `fmt.optimizer` (`REFERENCES`), written without `sparse_optim`."""
    ref = REFERENCES[fmt.optimizer](DIM, STD)
    gen = torch.Generator().manual_seed(0)
    for step in range(6):
        keys = torch.randint(0, 20, (12,), generator=gen)
        grads = torch.randn(12, DIM, generator=gen)
        lr, wd = (0.05, 0.01) if step % 2 else (0.1, 0.0)
        store.update(keys, grads, lr=lr, weight_decay=wd)
        ref.step(keys, grads, lr, wd)
    probe = torch.arange(25, dtype=torch.int64)
    got = store.lookup(probe).rows.cpu()
    want = torch.stack([ref.row(k) for k in probe.tolist()])
    tol = TOLERANCE[fmt.row_dtype]
    atol = (tol * 0.1 if fmt.row_dtype != "fp32" else 1e-7) + STATE_ATOL[fmt.state_dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=atol)


def sum_per_key(keys: torch.Tensor, grads: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each distinct key's summed gradient, in order of first appearance (what every store does before a step)."""
    summed: dict[int, torch.Tensor] = {}
    for k, g in zip(keys.tolist(), grads, strict=True):
        summed[k] = summed[k] + g if k in summed else g.clone()
    return summed


class ReferenceAdam:
    """torch.optim.Adam with one parameter per key, stepped only when the key is touched (lazy Adam)."""

    betas = ADAM_BETAS

    def __init__(self, dim: int, std: float) -> None:
        self.dim, self.std = dim, std
        self.params: dict[int, torch.nn.Parameter] = {}
        self.opts: dict[int, torch.optim.Adam] = {}

    def step(self, keys: torch.Tensor, grads: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        for k, g in sum_per_key(keys, grads).items():
            if k not in self.params:
                self.params[k] = torch.nn.Parameter(init_rows(keys_of(k), self.dim, self.std)[0].clone())
                self.opts[k] = torch.optim.Adam(
                    [self.params[k]], lr=lr, betas=self.betas, eps=ADAM_EPS, weight_decay=weight_decay
                )
            opt = self.opts[k]
            for group in opt.param_groups:
                group["lr"], group["weight_decay"] = lr, weight_decay
            self.params[k].grad = g.clone()
            opt.step()

    def row(self, k: int) -> torch.Tensor:
        return self.params[k].detach() if k in self.params else init_rows(keys_of(k), self.dim, self.std)[0]


class ReferenceRmsprop(ReferenceAdam):
    """torch.optim.Adam with beta1 = 0 per key: what `rmsprop` rows must do."""

    betas = (0.0, ADAM_BETAS[1])


class ReferenceRowwiseAdagrad:
    """fbgemm's row-wise AdaGrad written out per key in float64: acc += mean(g^2); row -= lr g / (sqrt(acc) + eps)."""

    def __init__(self, dim: int, std: float) -> None:
        self.dim, self.std = dim, std
        self.rows: dict[int, torch.Tensor] = {}
        self.acc: dict[int, float] = {}

    def step(self, keys: torch.Tensor, grads: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        for k, g in sum_per_key(keys, grads.double()).items():
            w = self.rows.get(k, init_rows(keys_of(k), self.dim, self.std)[0].double())
            g = g + weight_decay * w
            self.acc[k] = self.acc.get(k, 0.0) + float((g * g).mean())
            self.rows[k] = w - lr * g / (self.acc[k] ** 0.5 + ADAGRAD_EPS)

    def row(self, k: int) -> torch.Tensor:
        return self.rows[k].float() if k in self.rows else init_rows(keys_of(k), self.dim, self.std)[0]


class ReferencePartialRowwiseAdam:
    """fbgemm's PARTIAL_ROWWISE_ADAM written out per key in float64, each key bias-corrected by its own step count:
    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) mean(g^2); row -= lr m^ / (sqrt(v^) + eps).  `GROUPS`: the column
    ranges that share a v (one: the whole row)."""

    GROUPS: tuple[slice, ...] = (slice(None),)

    def __init__(self, dim: int, std: float) -> None:
        self.dim, self.std = dim, std
        self.rows: dict[int, torch.Tensor] = {}
        self.m: dict[int, torch.Tensor] = {}
        self.v: dict[int, list[float]] = {}
        self.t: dict[int, int] = {}

    def step(self, keys: torch.Tensor, grads: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        b1, b2 = ADAM_BETAS
        for k, g in sum_per_key(keys, grads.double()).items():
            w = self.rows.get(k, init_rows(keys_of(k), self.dim, self.std)[0].double())
            g = g + weight_decay * w
            t = self.t[k] = self.t.get(k, 0) + 1
            m = self.m[k] = b1 * self.m.get(k, torch.zeros(self.dim, dtype=torch.float64)) + (1 - b1) * g
            old = self.v.get(k, [0.0] * len(self.GROUPS))
            v = self.v[k] = [
                b2 * o + (1 - b2) * float((g[cols] * g[cols]).mean()) for o, cols in zip(old, self.GROUPS, strict=True)
            ]
            new = w.clone()
            for vg, cols in zip(v, self.GROUPS, strict=True):
                new[cols] = w[cols] - lr * (m[cols] / (1 - b1**t)) / ((vg / (1 - b2**t)) ** 0.5 + ADAM_EPS)
            self.rows[k] = new

    def row(self, k: int) -> torch.Tensor:
        return self.rows[k].float() if k in self.rows else init_rows(keys_of(k), self.dim, self.std)[0]


class ReferenceWideRowwiseAdam(ReferencePartialRowwiseAdam):
    """Partial row-wise Adam with one v for column 0 (the key's wide weight) and one for the other columns."""

    GROUPS = (slice(0, 1), slice(1, None))


class ReferenceSgd:
    """torch.optim.SGD with one parameter per key, stepped only when the key is touched."""

    def __init__(self, dim: int, std: float) -> None:
        self.dim, self.std = dim, std
        self.params: dict[int, torch.nn.Parameter] = {}

    def step(self, keys: torch.Tensor, grads: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        for k, g in sum_per_key(keys, grads).items():
            if k not in self.params:
                self.params[k] = torch.nn.Parameter(init_rows(keys_of(k), self.dim, self.std)[0].clone())
            p = self.params[k]
            p.grad = g.clone()
            torch.optim.SGD([p], lr=lr, weight_decay=weight_decay).step()

    def row(self, k: int) -> torch.Tensor:
        return self.params[k].detach() if k in self.params else init_rows(keys_of(k), self.dim, self.std)[0]


REFERENCES = {
    "adam": ReferenceAdam,
    "rmsprop": ReferenceRmsprop,
    "rowwise_adagrad": ReferenceRowwiseAdagrad,
    "partial_rowwise_adam": ReferencePartialRowwiseAdam,
    "wide_rowwise_adam": ReferenceWideRowwiseAdam,
    "sgd": ReferenceSgd,
}
"""`optim.sparse_optimizer` -> its oracle, written independently of `storage.embedding.rows.sparse_optim`."""
