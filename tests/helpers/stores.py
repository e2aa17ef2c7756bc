"""Small stores, reference optimisers and row comparisons for the embedding-store tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from storage.embedding.base import ADAM_BETAS, ADAM_EPS, EmbeddingStore
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.row_init import init_rows
from storage.embedding.snapshot import read_snapshot
from storage.embedding.ssd import SsdStore

DIM = 8
STD = 0.05


def keys_of(*ks: int) -> torch.Tensor:
    return torch.tensor(ks, dtype=torch.int64)


def all_rows(store: EmbeddingStore, url: str) -> dict[str, np.ndarray]:
    """Every row of `store`, via its snapshot, sorted by key."""
    store.snapshot(url)
    keys, emb, m, v, clock = read_snapshot(url)
    order = np.argsort(keys)
    return {"keys": keys[order], "emb": emb[order], "m": m[order], "v": v[order], "clock": clock[order]}


def assert_same_rows(a: EmbeddingStore, b: EmbeddingStore, tmp_path: Path) -> None:
    """`a` and `b` hold exactly the same rows (keys, embeddings, moments, clocks), bit for bit."""
    got, want = all_rows(a, str(tmp_path / "a.parquet")), all_rows(b, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def snapshot_arrays(url: str) -> tuple[np.ndarray, ...]:
    """(keys, emb, m, v, clock) of a snapshot, sorted by key."""
    keys, emb, m, v, clock = read_snapshot(url)
    o = np.argsort(keys)
    return keys[o], emb[o], m[o], v[o], clock[o]


def same_bytes(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def host_over_ssd(path: Path, rows: int = 20) -> HostStore:
    """A HostStore of `rows` rows over an SsdStore at `path`: small enough that rows spill in every test."""
    ssd = SsdStore(str(path), DIM, init_std=STD)
    return HostStore(DIM, budget_bytes=rows * host_row_bytes(DIM), below=ssd, init_std=STD)


def train_random(store: EmbeddingStore, steps: int, seed: int = 0) -> None:
    """`steps` updates of 32 random keys in [0, 100) with random gradients."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        store.update(torch.randint(0, 100, (32,), generator=gen), torch.randn(32, DIM, generator=gen), lr=0.05)


def fill_like_reference(store: EmbeddingStore, n: int, seed: int = 0) -> MemoryStore:
    """Three updates of `n` random keys in [0, 3n) applied to `store` and to a returned MemoryStore."""
    ref = MemoryStore(store.dim, init_std=STD)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        keys = torch.randint(0, n * 3, (n,), generator=gen)
        grads = torch.randn(n, store.dim, generator=gen)
        store.update(keys, grads, lr=0.05)
        ref.update(keys, grads, lr=0.05)
    return ref


class ReferenceAdam:
    """torch.optim.Adam with one parameter per key, stepped only when the key is touched (lazy Adam)."""

    def __init__(self, dim: int, std: float) -> None:
        self.dim, self.std = dim, std
        self.params: dict[int, torch.nn.Parameter] = {}
        self.opts: dict[int, torch.optim.Adam] = {}

    def step(self, keys: torch.Tensor, grads: torch.Tensor, lr: float, weight_decay: float = 0.0) -> None:
        summed: dict[int, torch.Tensor] = {}
        for k, g in zip(keys.tolist(), grads, strict=True):
            summed[k] = summed[k] + g if k in summed else g.clone()
        for k, g in summed.items():
            if k not in self.params:
                self.params[k] = torch.nn.Parameter(init_rows(keys_of(k), self.dim, self.std)[0].clone())
                self.opts[k] = torch.optim.Adam(
                    [self.params[k]], lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=weight_decay
                )
            opt = self.opts[k]
            for group in opt.param_groups:
                group["lr"], group["weight_decay"] = lr, weight_decay
            self.params[k].grad = g.clone()
            opt.step()

    def row(self, k: int) -> torch.Tensor:
        return self.params[k].detach() if k in self.params else init_rows(keys_of(k), self.dim, self.std)[0]
