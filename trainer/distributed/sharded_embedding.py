"""The model-parallel embedding table: every rank's store holds the rows of the keys it owns.

A step is a pull -> push pair, as torchrec splits a sharded lookup into an
input and an output dist: `pull` hands back a `Pulled` handle that carries
what the push needs (the route of the keys, the keys this rank served, its
store's `Lookup`), and `push` consumes it.  Nothing depends on which tensor
the caller passed or on what it did to it since.

The push of the synchronous path sends only the gradients, back along the pull's route (the owners
know the keys and the counts from the pull): a step is four all-to-alls (counts, keys, rows,
gradients), one host read (the counts') and, under NCCL, one copy to the host (the served keys, for the
store's key index): tests/trainer/test_step_host_reads.py counts them.  So the ranks never compare keys at
the push; each rank checks locally that it pushes the handle of its latest pull, once, and ranks that run
the same loop then push the same pull.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

from storage.embedding.base import EmbeddingStore, Lookup, owner_of
from storage.embedding.rows.segments import segment_sum
from storage.embedding.rows.transfer import host_to_device, is_host
from trainer.distributed.context import DistContext
from trainer.distributed.het_pull import pull_with_clocks
from trainer.distributed.routing import (
    Route,
    apply_updates,
    exchange_keys,
    exchange_rows,
    remote_counts,
    route_keys,
    send_grads,
    send_route_grads,
    unique_keys,
)
from trainer.distributed.staleness import StaleRowCache
from trainer.stateful import require_keys

COUNTERS = ("bytes_sent", "bytes_received", "bytes_by_kind", "uncached_bytes", "seconds", "steps")
"""What `ShardedEmbedding.state_dict` saves: its counters (the rows are the store's)."""


@dataclass(frozen=True, eq=False)
class Pulled:
    """The rows of one `ShardedEmbedding.pull` and what its `push` needs.

    The push of a handle neither deduplicates nor routes the keys again, and hands the owner's
    store its own `Lookup` of the served keys, so a caching tier does not resolve them a second
    time (`storage.embedding.base`).  The collectives are those of a push routed afresh.

    Attributes:
        rows: float32 (N, D) on `ctx.device`, the rows of the pulled keys in their order.
        seq: which pull of its embedding this is (1, 2, ...): a push takes the latest one, once.
        unique: the distinct keys (U,), sorted; `inverse` (N,) indexes them for every key.
        route: how `unique` travelled to the owners (the synchronous path; None on the HET cache
            path, whose push sends the keys the cache lets through, routed then).
        owned: the keys this rank served for every requester (M,), on the host (the stores index keys there).
        lookup: this rank's store's `Lookup` of `owned`, handed back to its `update`.
        recv_counts: keys each rank sent this one at the pull (the push's split sizes back).
    """

    rows: torch.Tensor
    unique: torch.Tensor
    inverse: torch.Tensor
    seq: int = 0
    route: Route | None = None
    owned: torch.Tensor | None = None
    lookup: Lookup | None = None
    recv_counts: list[int] | None = None


class ShardedEmbedding:
    """The model-parallel embedding table: rank r's `store` holds the keys with `owner_of(key, world) == r`.

    `pull` fetches rows for any keys from their owners (all-to-all of counts,
    then keys, then rows); `push` sends row gradients back to the owners, which
    apply sparse Adam.  Both are collectives: every rank must call them in the
    same order (a rank with no keys passes an empty tensor), pull then push of
    its handle, once per step.

    With `staleness_bound > 0` (and more than one rank) remote rows go through
    a `trainer.distributed.staleness.StaleRowCache` (HET, per-row clocks): a cached copy is
    checked against its owner's clock at each pull that needs it and served
    while it misses at most `staleness_bound` updates; the rank applies its
    own gradients to the copy and sums them, and pushes the sum when the bound
    would be crossed or the copy is evicted.  `flush()` pushes every pending
    gradient (a collective; call it on every rank before reading or
    snapshotting the store).  With bound 0 the synchronous path runs unchanged.

    Bytes moved between ranks (sent + received by this rank; the rows of keys
    a rank owns itself never leave it and are not counted) are counted by kind in
    `bytes_by_kind`: `pull_keys`, `pull_rows`, `push` (keys, gradients and,
    with the cache, update counts) and `clock` (the cache's clock checks).
    `uncached_bytes` counts what the synchronous path would have moved for the
    same keys (summed over ranks it equals the synchronous run's `sparse_bytes`).

    Args:
        store: this rank's shard of the table.
        ctx: the distributed context.
        lr: sparse-Adam learning rate of the rows.
        weight_decay: passed to `store.update`.
        staleness_bound: HET bound in row updates (0 = synchronous).
        cache_rows: capacity of the cache of remote rows.
        use_cache: force the cache path on or off (default: on when the bound is > 0 and world > 1);
            the cache path with bound 0 computes bit-for-bit what the synchronous path does.

    Example::

        emb = ShardedEmbedding(store, ctx, lr=1e-2)
        pulled = emb.pull(keys.reshape(-1))
        rows = pulled.rows.view(B, F, D).requires_grad_()
        ...loss.backward()...
        emb.push(pulled, rows.grad.reshape(-1, D))
    """

    KINDS = ("pull_keys", "pull_rows", "push", "clock")

    def __init__(
        self,
        store: EmbeddingStore,
        ctx: DistContext,
        *,
        lr: float,
        weight_decay: float = 0.0,
        staleness_bound: int = 0,
        cache_rows: int = 1_000_000,
        use_cache: bool | None = None,
    ) -> None:
        self.store, self.ctx = store, ctx
        self.dim = store.dim
        self.lr, self.weight_decay = lr, weight_decay
        self.bytes_sent = 0
        self.bytes_received = 0
        self.bytes_by_kind = dict.fromkeys(self.KINDS, 0)
        self.uncached_bytes = 0
        self.seconds = 0.0
        self.steps = 0
        """Pushes done (the step the next pull belongs to)."""
        if use_cache is None:
            use_cache = staleness_bound > 0 and ctx.world_size > 1
        self.cache = (
            StaleRowCache(store.dim, bound=staleness_bound, capacity=cache_rows, rule=store.row_format.rule)
            if use_cache
            else None
        )
        self._pulls = 0
        """Pulls made; `_pushed`: the pull whose handle was pushed last."""
        self._pushed = 0

    def _to_store(self, t: torch.Tensor) -> torch.Tensor:
        """`t` where the store's rows are: a GPU rank's gradients reach a host-memory store here, a blocking
        device-to-host copy every push (`store.device_cache_rows: 0` on CUDA); with the device tier, the default
        on CUDA (`storage.embedding.tiered.device_cache_rows`), they stay on the GPU."""
        return host_to_device(t, self.store.device)

    def check_updates(self) -> None:
        """Raise a refusal of non-finite gradients that this rank's store deferred (`EmbeddingStore.check_updates`:
        a GPU tier reads it here, at a step that reads the device anyway, not at every push)."""
        self.store.check_updates()

    def _count(self, kind: str, sent: int, received: int) -> None:
        if self.ctx.world_size > 1:
            self.bytes_sent += sent
            self.bytes_received += received
            self.bytes_by_kind[kind] += sent + received

    def pull(self, keys: torch.Tensor) -> Pulled:
        """The rows of host `keys` (N,) as float32 (N, D) on `ctx.device` (`Pulled.rows`), in the order of `keys`.

        The keys stay on the host (the reader's tensors): routing and the stores' key indexes run there.
        """
        t0 = time.perf_counter()
        flat = keys.reshape(-1).to(torch.int64)
        self._pulls += 1
        pulled = self._pull_cached(flat) if self.cache is not None else self._pull_sync(flat)
        self.seconds += time.perf_counter() - t0
        return dataclasses.replace(pulled, seq=self._pulls)

    def prefetch(self, keys: torch.Tensor) -> None:
        """Hint this rank's store with the keys of a coming batch that it owns (`EmbeddingStore.prefetch`: the SSD
        tier reads the rows the host tier lacks while the step computes).  Other ranks' keys in their own batches
        arrive only with their pull, so with several ranks this covers the rank's own batch's share."""
        flat = keys.reshape(-1).to(torch.int64)
        if self.ctx.world_size > 1:
            flat = flat[owner_of(flat, self.ctx.world_size) == self.ctx.rank]
        self.store.prefetch(flat.numpy())

    def push(self, pulled: Pulled, grads: torch.Tensor) -> None:
        """Apply `grads` (N, D) of the keys of `pulled` on their owners (duplicates summed, one Adam step per row).

        Gradients of another float type (a mixed-precision step's) are converted to float32 here, once:
        the store takes float32 only.

        Raises:
            ValueError: the handle is not this rank's latest pull, or was pushed already (push each
                pull's handle once, in the order of the pulls, on every rank), or is not from this
                embedding's path; nothing is sent or applied.
        """
        if pulled.seq != self._pulls or pulled.seq == self._pushed:
            raise ValueError(
                f"rank {self.ctx.rank} pushed the handle of pull {pulled.seq} (latest pull {self._pulls}, last pushed "
                f"{self._pushed}): every rank must push the handle of the same pull, its latest, once"
            )
        t0 = time.perf_counter()
        grads = grads.detach().reshape(pulled.inverse.numel(), self.dim)
        if grads.dtype != torch.float32:
            grads = grads.float()
        if self.cache is not None:
            self._send(*self._stage_cached(pulled, grads))
        else:
            self._push_routed(pulled, grads)
        self._pushed = pulled.seq
        self.steps += 1
        self.seconds += time.perf_counter() - t0

    def flush(self) -> None:
        """Push every gradient the cache still holds and empty it (a collective; no-op without a cache)."""
        if self.cache is None:
            return
        t0 = time.perf_counter()
        self.cache.drain()
        self._send(*self.cache.take_outgoing())
        self.seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ the synchronous path

    def _pull_sync(self, keys: torch.Tensor) -> Pulled:
        route, owned, recv_counts = exchange_keys(keys, self.ctx)
        if not is_host(owned.device):  # NCCL delivers the keys on the GPU
            owned = owned.cpu()  # host read: the store's key index lives on the host (a copy the lookup waits for)
        looked = self.store.lookup(owned)
        served = looked.rows  # (M, D) rows this rank owns, for the requesters
        rows = exchange_rows(served, route, recv_counts, self.ctx)  # (U, D)
        asked, got = remote_counts(route.send_counts, recv_counts, self.ctx.rank)
        row_b = self.dim * served.element_size()
        self._count("pull_keys", 8 * asked, 8 * got)
        self._count("pull_rows", row_b * got, row_b * asked)
        dev = self.ctx.device
        out = host_to_device(rows, dev).index_select(0, host_to_device(route.inverse, dev))  # (N, D)
        return Pulled(
            out, route.unique, route.inverse, route=route, owned=owned, lookup=looked, recv_counts=recv_counts
        )

    def _push_routed(self, pulled: Pulled, grads: torch.Tensor) -> None:
        if pulled.route is None or pulled.owned is None or pulled.lookup is None or pulled.recv_counts is None:
            raise ValueError("push() got the handle of a HET-cache pull; this embedding runs the synchronous path")
        owned_grads, (sent, received) = send_route_grads(pulled.route, pulled.recv_counts, grads, self.ctx)
        self._count("push", sent, received)
        if pulled.owned.numel():
            self.store.update(pulled.lookup, self._to_store(owned_grads), lr=self.lr, weight_decay=self.weight_decay)

    # ------------------------------------------------------------------ the HET cache path

    def _pull_cached(self, keys: torch.Tensor) -> Pulled:
        assert self.cache is not None  # noqa: S101 - an invariant, for mypy
        cache = self.cache
        unique, inverse = unique_keys(keys)  # (U,), (N,)
        cached, pos = cache.find(unique)  # only remote keys are ever cached
        check, need = unique[cached], unique[~cached]
        # the largest owner clock at which a copy is still valid: clock - base + local <= bound
        threshold = cache.base[pos[cached]] - cache.local[pos[cached]] + cache.bound
        got = pull_with_clocks(self.store, need, check, threshold, self.ctx)
        for kind, (sent, received) in got.nbytes.items():
            self._count(kind, sent, received)
        valid, hit_rows = cache.serve(check, got.check_clocks, step=self.steps)
        if not torch.equal(valid, ~got.stale):
            raise RuntimeError("HET cache and owners disagree on which copies are stale (internal error)")
        rows = torch.empty((unique.numel(), self.dim), dtype=torch.float32)
        rows[~cached] = got.need_rows.to(rows.dtype)
        idx_check = torch.nonzero(cached).reshape(-1)
        rows[idx_check[valid]] = hit_rows
        rows[idx_check[~valid]] = got.stale_rows.to(rows.dtype)
        # cache the fresh copies of remote keys (stale ones included: refetched with their new clocks)
        remote = owner_of(unique, self.ctx.world_size) != self.ctx.rank
        fresh = ~cached & remote
        fresh_rows = torch.cat([got.need_rows[remote[~cached]], got.stale_rows])
        fresh_clocks = torch.cat([got.need_clocks[remote[~cached]], got.check_clocks[~valid]])
        cache.insert(torch.cat([unique[fresh], check[~valid]]), fresh_rows, fresh_clocks, step=self.steps)
        dev = self.ctx.device
        return Pulled(host_to_device(rows, dev)[host_to_device(inverse, dev)], unique, inverse)  # rows (N, D)

    def _stage_cached(self, pulled: Pulled, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sum `grads` per key, keep the cached copies' share, and return what must be sent this step."""
        assert self.cache is not None  # noqa: S101 - an invariant, for mypy
        unique = pulled.unique
        summed = segment_sum(grads, pulled.inverse, unique.numel())  # (U, D), as `send_grads` sums them
        # what the synchronous path moves for these keys: key + row at the pull, the gradient at the push
        # of every remote key, each counted once sent and once received
        remote = int((owner_of(unique, self.ctx.world_size) != self.ctx.rank).sum())
        self.uncached_bytes += 2 * remote * (8 + 2 * self.dim * summed.element_size())
        cached = self.cache.accumulate(unique, summed, lr=self.lr, weight_decay=self.weight_decay)
        self.cache.expire(self.steps)
        out_keys, out_grads, out_counts = self.cache.take_outgoing()
        direct = torch.nonzero(~cached).reshape(-1)  # a host mask: its positions cost the device nothing
        # the direct keys' gradients stay on the device (gathered by index: a boolean mask of a device
        # tensor would wait for it); only the cached copies' share reached the host cache (`accumulate`),
        # and the pending sums it releases go to the device to be sent with them
        return (
            torch.cat([unique[direct], out_keys]),
            torch.cat(
                [
                    summed.index_select(0, host_to_device(direct, summed.device)),
                    host_to_device(out_grads, summed.device).to(summed.dtype),
                ]
            ),
            torch.cat([torch.ones(direct.numel(), dtype=torch.int64), out_counts]),
        )

    def _send(self, keys: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor) -> None:
        """Route `keys` afresh and apply their gradients (sums of `counts` updates each) on the owners."""
        route = route_keys(keys, self.ctx.world_size)
        owned, owned_grads, owned_counts, (sent, received) = send_grads(route, grads, self.ctx, counts)
        self._count("push", sent, received)
        if owned.numel():
            apply_updates(
                self.store,
                self._to_store(owned),
                self._to_store(owned_grads),
                None if owned_counts is None else self._to_store(owned_counts),
                lr=self.lr,
                weight_decay=self.weight_decay,
            )

    # ------------------------------------------------------------------ counters

    @property
    def sparse_bytes(self) -> int:
        return self.bytes_sent + self.bytes_received

    def comm_stats(self) -> dict[str, Any]:
        """This rank's sparse-communication counters (for model.json): bytes by kind, the uncached
        equivalent (0 without a cache) and the cache's counters (None without a cache)."""
        return {
            "sparse_bytes": self.sparse_bytes,
            "bytes_by_kind": dict(self.bytes_by_kind),
            "uncached_bytes": self.uncached_bytes if self.cache is not None else self.sparse_bytes,
            "cache": self.cache.stats() if self.cache is not None else None,
        }

    def state_dict(self) -> dict[str, Any]:
        """The counters (`COUNTERS`); the rows are the store's to save (`EmbeddingStore.snapshot`).

        Raises:
            RuntimeError: the HET cache still holds copies, whose pending gradients a restart would
                lose: `flush()` (a collective) first.
        """
        if self.cache is not None and len(self.cache):
            raise RuntimeError(f"the HET cache holds {len(self.cache)} copies: flush() before state_dict()")
        return {name: dict(v) if isinstance(v := getattr(self, name), dict) else v for name in COUNTERS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the counters of `state_dict`.

        Raises:
            ValueError: `state` lacks a counter.
        """
        require_keys(state, COUNTERS, "sharded embedding")
        for name in COUNTERS:
            setattr(self, name, dict(state[name]) if name == "bytes_by_kind" else state[name])
