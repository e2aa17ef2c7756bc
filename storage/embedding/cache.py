"""The caching layer shared by `HostStore` and `DeviceCache`.

`SlotCache` is the pure bookkeeping of a bounded cache (NumPy only, no rows):
key -> slot map, per-slot access frequency and last-access tick (packed in one
int64 per slot, so a touch reads and writes one cache line per row), the
replacement policy (LFU with LRU tie-break, or LRU), and per-slot flags
(`dirty`: changed since last written below; `in_below`: the tier below holds a
copy).  `simulate_hit_rate` drives it alone, so benchmarks measure exactly the
policy the stores run.

`CachingTier` is an `EmbeddingStore` that keeps full rows (embedding + Adam state) in
a `RowBuffer` on its device over an injected lower tier (`below`), inclusive
and write-back:

- a row read from below is admitted clean (`in_below`); an update makes it dirty;
- admission and eviction happen once per call, for the whole batch; the keys of
  the current call are never victims; dirty victims are written below in one
  `write_rows` call;
- keys that do not fit (a batch larger than the cache) pass through to below;
- a row exists in the store once updated, warmed or restored: `lookup` of an
  unknown key returns its `init_rows` row without storing or caching it.

Counters (`stats()[tier]`): hits / misses of distinct keys per call at this
level; bytes_read / bytes_written: row bytes fetched from / written to the
level below (for a bottom tier: written into this one); evictions: rows dropped
for room or by `evict`; rows: rows held at this level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from storage.embedding.base import EmbeddingStore, Lookup
from storage.embedding.config import POLICIES
from storage.embedding.index import SlotMap
from storage.embedding.row_init import init_rows
from storage.embedding.rows import (
    RowBuffer,
    Rows,
    check_keys,
    check_update,
    row_bytes,
    sparse_adam,
    strictly_increasing,
    sum_duplicates,
)
from storage.embedding.snapshot import (
    SnapshotWriter,
    check_snapshot_dim,
    iter_snapshot,
)

_FREQ_CAP = (1 << 30) - 1
_TICK_BITS = 33
"""A slot's score is ``freq << 33 | last_tick``: the LFU order (ties by recency) as one int64."""
_ONE_ACCESS = np.int64(1 << _TICK_BITS)
_TICK_MASK = np.int64((1 << _TICK_BITS) - 1)
_FREQ_MASK = ~_TICK_MASK


class StoreCapacityError(RuntimeError):
    """A tier with no tier below ran out of room for rows it must keep."""


class SlotCache:
    """Bookkeeping of a cache of `capacity` slots (None: unbounded) with a replacement policy.

    Args:
        capacity: number of slots, or None for no bound (nothing is ever evicted).
        policy: ``"lfu"`` (least accesses first, ties by least recent) or ``"lru"``.
        evict_extra: when a call must evict, also free up to this fraction of `capacity`
            more slots (the coldest residents), so the scan over all residents that
            choosing victims costs is paid once per that many new rows, not on every call.
            0 evicts exactly what the call needs.
    """

    def __init__(self, capacity: int | None, policy: str = "lfu", *, evict_extra: float = 0.0) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 row, got {capacity}")
        if not 0.0 <= evict_extra < 1.0:
            raise ValueError(f"evict_extra must be in [0, 1), got {evict_extra}")
        self.capacity = capacity
        self.policy = policy
        self.evict_extra = evict_extra
        self.scans = 0  # victim selections run (each one scans every resident)
        self.map = SlotMap(capacity)
        self.tick = 0
        self._grow(capacity or 0)

    def _grow(self, n: int) -> None:
        old = getattr(self, "_score", np.empty(0, dtype=np.int64)).size
        if n <= old and old:
            return
        n = max(n, 2 * old, 1024) if self.capacity is None else max(n, old)
        for name, dtype in (("_score", np.int64), ("dirty", bool), ("in_below", bool)):
            arr = np.zeros(n, dtype=dtype)
            if old:
                arr[:old] = getattr(self, name)
            setattr(self, name, arr)

    def __len__(self) -> int:
        return len(self.map)

    @property
    def freq(self) -> np.ndarray:
        """Accesses per slot (a copy; capped at 2^30 - 1)."""
        return self._score >> _TICK_BITS

    @property
    def last(self) -> np.ndarray:
        """Tick of each slot's last access (a copy)."""
        return self._score & _TICK_MASK

    def add(self, keys: np.ndarray) -> np.ndarray:
        """Slots for new (absent, distinct) keys, flags cleared."""
        slots = self.map.add(keys)
        if slots.size:
            self._grow(int(slots.max()) + 1)
        self._score[slots] = 0
        self.dirty[slots] = False
        self.in_below[slots] = False
        return slots

    def touch(self, slots: np.ndarray, counts: np.ndarray | int = 1) -> None:
        """Record an access (of `counts` occurrences) to each distinct slot."""
        freq = np.minimum((self._score[slots] >> _TICK_BITS) + counts, _FREQ_CAP)
        self._score[slots] = (freq << _TICK_BITS) | self.tick

    def touch_accesses(self, slots: np.ndarray) -> int:
        """Record one access per element of `slots` (resident; duplicates allowed), without sorting.

        Same effect as `touch` over the distinct slots with their occurrence counts: frequencies
        grow by one scatter-add, the last-access tick is set.  Returns the number of distinct slots.
        """
        n = slots.size
        if n == 0:
            return 0
        s = self._score
        before = s[slots]
        np.add.at(s, slots, _ONE_ACCESS)  # exact with duplicates: one increment per occurrence
        after = s[slots]
        # Each occurrence of a slot seen c times in this call sees its frequency grow by c, and the
        # c occurrences contribute c * (1/c) = 1: the sum is the number of distinct slots (no sort).
        grown = (after - before) >> _TICK_BITS
        distinct = int(np.rint(np.reciprocal(grown.astype(np.float64)).sum()))
        freq = after.view(np.uint64) >> np.uint64(_TICK_BITS)  # unsigned: a frequency past the cap may reach bit 63
        after &= _FREQ_MASK
        if int(freq.max()) > _FREQ_CAP:
            after = np.minimum(freq, _FREQ_CAP).astype(np.int64) << _TICK_BITS
        after |= self.tick
        s[slots] = after
        return distinct

    def next_tick(self) -> None:
        """Start a new call: accesses from now on are more recent than all before."""
        self.tick += 1

    def plan(self, new_counts: np.ndarray, protect: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which residents to evict and which newcomers to admit, for one call.

        Newcomers (scored as if admitted now, with their occurrence counts) compete
        with the residents not in `protect` (the slots the call uses); the lowest
        scores lose: losing residents are evicted, losing newcomers are not admitted
        (the caller passes them through to the tier below).  This is what admitting
        them one by one into an LFU/LRU cache would do, batched.

        Returns:
            (victim slots, bool admit mask over the newcomers).
        """
        m = new_counts.size
        admit = np.ones(m, dtype=bool)
        free = self.map.free_slots if self.capacity is not None else m
        if m <= free:
            return np.empty(0, dtype=np.int64), admit
        live = self.map.live_slots()
        if protect.size:
            mask = np.ones(self.map.slot_keys.size, dtype=bool)
            mask[protect] = False
            live = live[mask[live]]
        if self.policy == "lru":
            rs = self._score[live] & _TICK_MASK
            ns = np.full(m, self.tick, dtype=np.int64)
        else:  # LFU, ties broken by recency (ticks stay far below 2^33)
            rs = self._score[live]
            ns = (np.minimum(new_counts, _FREQ_CAP).astype(np.int64) << _TICK_BITS) | self.tick
        self.scans += 1
        score = np.concatenate([rs, ns])
        n_drop = m - free
        # Take the k lowest scores overall (k includes the slack): their residents are evicted;
        # of their newcomers only as many as the freed room cannot hold are turned away.
        k = min(score.size, n_drop + int(self.evict_extra * (self.capacity or 0)))
        drop = np.argpartition(score, k - 1)[:k] if k < score.size else np.arange(score.size)
        victims = live[drop[drop < live.size]]
        low_new = drop[drop >= live.size]
        n_reject = n_drop - victims.size
        if n_reject > 0:
            if n_reject < low_new.size:  # the lowest-scored newcomers lose
                low_new = low_new[np.argpartition(score[low_new], n_reject - 1)[:n_reject]]
            admit[low_new - live.size] = False
        return victims, admit


def simulate_hit_rate(
    key_stream: np.ndarray, capacity: int, policy: str = "lfu", *, batch: int = 4096, evict_extra: float = 0.0
) -> float:
    """Hit rate of a cache of `capacity` rows with `policy` over `key_stream`, batch by batch.

    Runs the same `SlotCache` admission and eviction the `DeviceCache` runs:
    each batch's distinct keys are looked up, the misses admitted after evicting
    the coldest rows not used by the batch.  Counts one access per distinct key
    per batch (what moves rows between tiers); `simulate_hit_rates` also gives
    the per-access rate.

    Args:
        key_stream: int64 keys in access order.
        capacity: cache size in rows (>= 1).
        policy: ``"lfu"`` or ``"lru"``.
        batch: keys per training step.
        evict_extra: the cache's eviction slack (see `SlotCache`).

    Returns:
        hits / (hits + misses), 0.0 for an empty stream.
    """
    return simulate_hit_rates(key_stream, capacity, policy, batch=batch, evict_extra=evict_extra)["distinct"]


def simulate_hit_rates(
    key_stream: np.ndarray, capacity: int, policy: str = "lfu", *, batch: int = 4096, evict_extra: float = 0.0
) -> dict[str, float]:
    """`simulate_hit_rate`, counted two ways.

    Returns:
        ``{"distinct": ..., "access": ...}``: "distinct" counts one lookup per distinct key
        per batch; "access" counts every occurrence in the stream (the way a per-lookup
        cache such as HET's is measured): a resident key's occurrences all hit; an admitted
        newcomer misses once and its other occurrences in the batch hit; a newcomer that is
        not admitted misses on every occurrence.  0.0 for an empty stream.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    cache = SlotCache(capacity, policy, evict_extra=evict_extra)
    stream = np.ascontiguousarray(key_stream, dtype=np.int64)
    hits = total = access_hits = 0
    for lo in range(0, stream.size, batch):
        cache.next_tick()
        uniq, counts = np.unique(stream[lo : lo + batch], return_counts=True)
        slots = cache.map.lookup(uniq)
        hit = slots >= 0
        hits += int(hit.sum())
        total += uniq.size
        access_hits += int(counts[hit].sum())
        miss = np.flatnonzero(~hit)
        gone, admit = cache.plan(counts[miss], slots[hit])
        cache.map.remove(cache.map.slot_keys[gone])
        admit = miss[admit]
        access_hits += int(counts[admit].sum()) - admit.size
        slots[admit] = cache.add(uniq[admit])
        res = slots >= 0
        cache.touch(slots[res], counts[res])
    if not total:
        return {"distinct": 0.0, "access": 0.0}
    return {"distinct": hits / total, "access": access_hits / stream.size}


@dataclass(frozen=True)
class _Plan:
    """What a `lookup` of sorted distinct keys resolved (the `Lookup.plan` of a caching tier).

    A sharded step looks its owned keys up at the pull and updates the same keys at the push, with no
    other call to the tier in between; an `update` given that `Lookup` then reuses the slots and the
    rows read below instead of hashing the keys and reading the misses below a second time.  The plan
    is valid while the tier's `generation` is the one it was made at: any other call changes it.
    """

    tier: int
    """`id` of the tier that made it (a plan only ever serves its own tier)."""
    generation: int
    slots: np.ndarray
    """Slot of each key after the lookup (-1: not resident)."""
    found_out: np.ndarray
    """Whether the tier below holds each non-resident key."""
    rows_out: Rows | None
    """The non-resident keys' rows as read below (None when every key is resident)."""


class CachingTier(EmbeddingStore):
    """A bounded write-back cache of full rows over an optional lower tier.  See the module docstring.

    Args:
        dim: row width.
        init_std: std of `init_rows`.
        device: where cached rows live.
        capacity: rows held at most (None: unbounded).
        policy: ``"lfu"`` or ``"lru"``.
        below: the tier below, or None.
        preallocate: allocate all `capacity` rows up front (a device cache) instead of growing.
        evict_extra: eviction slack, a fraction of `capacity` (see `SlotCache`).
    """

    tier = "cache"

    def __init__(
        self,
        dim: int,
        *,
        init_std: float,
        device: torch.device | str,
        capacity: int | None,
        policy: str,
        below: EmbeddingStore | None,
        preallocate: bool = False,
        evict_extra: float = 0.0,
    ) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
        if below is not None:
            if not isinstance(below, EmbeddingStore):
                raise TypeError(f"below must be an EmbeddingStore (a storage tier), got {type(below).__name__}")
            if below.dim != dim:
                raise ValueError(f"below has dim {below.dim}, this tier has dim {dim}")
        self.dim = dim
        self.init_std = init_std
        self.device = torch.device(device)
        self.below = below
        self._cache = SlotCache(capacity, policy, evict_extra=evict_extra)
        self._buf = RowBuffer(
            dim, self.device, capacity if (preallocate and capacity) else 0, fixed=preallocate, limit=capacity
        )
        self._counters = dict.fromkeys(("hits", "misses", "bytes_read", "bytes_written", "evictions"), 0)
        self._generation = 0
        """Counts the calls that change the tier: a `Lookup.plan` is reusable while this is unchanged."""

    @property
    def capacity(self) -> int | None:
        """Rows this tier holds at most (None: unbounded)."""
        return self._cache.capacity

    @property
    def policy(self) -> str:
        """Replacement policy, `lfu` or `lru`."""
        return self._cache.policy

    # -- internals ------------------------------------------------------------------
    def _read_below(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        if self.below is None or keys.size == 0:
            fresh = Rows.fresh(init_rows(torch.from_numpy(keys), self.dim, self.init_std))
            return np.zeros(keys.size, dtype=bool), fresh
        found, rows = self.below.read_rows(keys)
        self._counters["bytes_read"] += int(found.sum()) * row_bytes(self.dim)
        return found, rows

    def _write_below(self, keys: np.ndarray, rows: Rows) -> None:
        if keys.size == 0:
            return
        if self.below is None:
            raise StoreCapacityError("no tier below to write rows to")  # unreachable: unbounded without below
        self.below.write_rows(keys, rows)
        self._counters["bytes_written"] += keys.size * row_bytes(self.dim)

    def _admit_plan(self, counts: np.ndarray, protect: np.ndarray) -> np.ndarray:
        """Evict for the newcomers with `counts`; returns the admit mask over them."""
        c = self._cache
        if self.below is None:
            if c.capacity is not None and counts.size > c.map.free_slots:
                raise StoreCapacityError(
                    f"{self.tier} tier is full ({c.capacity} rows, {counts.size} new) and has no tier below "
                    "to spill to; raise its budget or give it a `below` tier"
                )
            return np.ones(counts.size, dtype=bool)
        gone, admit = c.plan(counts, protect)
        self._drop(gone, write_back=True)
        return admit

    def _drop(self, slots: np.ndarray, *, write_back: bool) -> None:
        c = self._cache
        if slots.size == 0:
            return
        keys = c.map.slot_keys[slots]
        if write_back:
            dirty = c.dirty[slots]
            if dirty.any():
                self._write_below(keys[dirty], self._buf.gather(slots[dirty]))
            self._counters["evictions"] += slots.size
        c.map.remove(keys)
        c.dirty[slots] = False
        c.in_below[slots] = False

    def _resolve(
        self, keys: np.ndarray, counts: np.ndarray | int, mode: str, *,
        slots: np.ndarray | None = None, below: tuple[np.ndarray, Rows | None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Rows | None]:
        """Make the distinct `keys` resident where they fit.

        mode: ``"read"`` admits only rows the tier below holds; ``"create"`` admits
        every key (reading old values below); ``"write"`` admits every key without
        reading below (the caller overwrites the rows).

        slots: the keys' slots when the caller has just looked them up (the map unchanged since),
        so they are not hashed again; `below`: (found mask, rows) of the keys with slot -1 as just
        read from the tier below (an earlier `lookup` of the same keys), so they are not read again.

        Returns (slots (-1: not resident), outside positions, found-below mask of
        the outside keys, rows of the outside keys (None in write mode)).
        """
        c = self._cache
        c.next_tick()
        slots = c.map.lookup(keys) if slots is None else slots
        miss = np.flatnonzero(slots < 0)
        self._counters["hits"] += keys.size - miss.size
        self._counters["misses"] += miss.size
        outside = miss
        found_out = np.zeros(0, dtype=bool)
        rows_out: Rows | None = None
        if miss.size:
            mkeys = keys[miss]
            if mode == "write":
                found = self.below.contains(mkeys) if self.below is not None else np.zeros(miss.size, dtype=bool)
                rows = None
            elif below is not None and below[1] is not None:
                found, rows = below  # read below by the lookup just before: count the read, do not redo it
                self._counters["bytes_read"] += int(found.sum()) * row_bytes(self.dim) if self.below is not None else 0
            else:
                found, rows = self._read_below(mkeys)
            want = found if mode == "read" else np.ones(miss.size, dtype=bool)
            want_idx = np.flatnonzero(want)
            mcounts = np.ones(miss.size, dtype=np.int64) if np.isscalar(counts) else counts[miss]
            take = want_idx[self._admit_plan(mcounts[want_idx], slots[slots >= 0])]
            if take.size:
                new = c.add(mkeys[take])
                if rows is not None:
                    self._buf.scatter(new, rows.select(take))
                c.in_below[new] = found[take]
                slots[miss[take]] = new
            rest = np.ones(miss.size, dtype=bool)
            rest[take] = False
            outside = miss[rest]
            found_out = found[rest]
            rows_out = rows.select(np.flatnonzero(rest)) if rows is not None else None
        res = slots >= 0
        c.touch(slots[res], counts if np.isscalar(counts) else counts[res])
        return slots, outside, found_out, rows_out

    # -- tier-to-tier interface ----------------------------------------------------------
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        self._generation += 1
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots, outside, found_out, rows_out = self._resolve(keys, 1, "read")
        res = np.flatnonzero(slots >= 0)
        found = np.ones(keys.size, dtype=bool)
        found[outside] = found_out
        if outside.size == 0:
            return found, self._buf.gather(slots)
        rows = Rows.empty(keys.size, self.dim, self.device)
        rows.put(res, self._buf.gather(slots[res]))
        rows.put(outside, rows_out)
        return found, rows

    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        self._generation += 1
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots, outside, _, _ = self._resolve(keys, 1, "write")
        res = np.flatnonzero(slots >= 0)
        self._buf.scatter(slots[res], rows.select(res))
        self._cache.dirty[slots[res]] = True
        if self.below is None:
            self._counters["bytes_written"] += res.size * row_bytes(self.dim)
        if outside.size:
            self._write_below(keys[outside], rows.select(outside))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        held = self._cache.map.lookup(keys) >= 0
        if self.below is not None and not held.all():
            held[~held] = self.below.contains(keys[~held])
        return held

    # -- contract ----------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Lookup:
        """Rows of `keys`; for keys that are sorted and distinct (a sharded pull's) the `Lookup` carries
        what was resolved, for an `update` of it right after (`_Plan`)."""
        self._generation += 1
        k = check_keys(keys)
        handle_keys = torch.from_numpy(k.copy())
        c = self._cache
        slots = c.map.lookup(k)
        distinct = strictly_increasing(k)
        if k.size and (slots >= 0).all():
            # Fast path, every key resident: no sort, no de-dup; one scatter-add for the frequencies.
            c.next_tick()
            plan = None
            if distinct:  # one access per slot: the plain touch does it without the scatter-add
                c.touch(slots)
                self._counters["hits"] += k.size
                plan = self._plan(slots, np.zeros(0, dtype=bool), None)
            else:
                self._counters["hits"] += c.touch_accesses(slots)
            return Lookup(handle_keys, self._buf.gather_emb(slots), plan)
        plan = None
        if distinct:  # already np.unique's output: no sort, and `slots` need no second hashing
            uniq, inverse, counts = k, None, 1
            slots, outside, found_out, rows_out = self._resolve(uniq, counts, "read", slots=slots)
            plan = self._plan(slots, found_out, rows_out)
        else:
            uniq, inverse, counts = np.unique(k, return_inverse=True, return_counts=True)
            slots, outside, _, rows_out = self._resolve(uniq, counts, "read")
        if outside.size == 0:  # all resident: one gather straight into the caller's order
            return Lookup(handle_keys, self._buf.gather_emb(slots if inverse is None else slots[inverse.reshape(-1)]), plan)
        out = torch.empty((uniq.size, self.dim), dtype=torch.float32, device=self.device)
        res = np.flatnonzero(slots >= 0)
        dev = self.device
        out.index_copy_(0, torch.from_numpy(res).to(dev), self._buf.gather_emb(slots[res]))
        out.index_copy_(0, torch.from_numpy(outside).to(dev), rows_out.emb.to(dev))
        if inverse is None:
            return Lookup(handle_keys, out, plan)
        return Lookup(handle_keys, out.index_select(0, torch.from_numpy(inverse.reshape(-1)).to(self.device)), plan)

    def _plan(self, slots: np.ndarray, found_out: np.ndarray, rows_out: Rows | None) -> _Plan:
        return _Plan(id(self), self._generation, slots, found_out, rows_out)

    def update(self, target: torch.Tensor | Lookup, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0) -> None:
        plan = target.plan if isinstance(target, Lookup) else None
        if not (isinstance(plan, _Plan) and plan.tier == id(self) and plan.generation == self._generation):
            plan = None  # another tier's, or the tier changed since the lookup: resolve afresh
        self._generation += 1
        keys = target.keys if isinstance(target, Lookup) else target
        k = check_update(keys, grads, self.dim, lr=lr, weight_decay=weight_decay)
        if k.size == 0:
            return
        uniq, g = sum_duplicates(k, grads.to(self.device))
        if uniq is k:  # sorted distinct keys: each occurs once
            counts: np.ndarray | int = 1
        else:
            counts = np.unique(k, return_counts=True)[1]
        if plan is not None and uniq is k:
            # the same keys as the lookup just before: its slots and rows read below still hold
            slots, outside, _, rows_out = self._resolve(
                uniq, counts, "create", slots=plan.slots.copy(), below=(plan.found_out, plan.rows_out)
            )
        else:
            slots, outside, _, rows_out = self._resolve(uniq, counts, "create")
        res = np.flatnonzero(slots >= 0)
        # Compute every new row first (sparse_adam refuses non-finite results), then write: a
        # refused update changes no value here or below.
        new_res = new_out = None
        if res.size:
            idx = torch.from_numpy(res).to(self.device)
            new_res = sparse_adam(self._buf.gather(slots[res]), g.index_select(0, idx), lr=lr, weight_decay=weight_decay)
        if outside.size:
            idx = torch.from_numpy(outside).to(self.device)
            new_out = sparse_adam(rows_out.to(self.device), g.index_select(0, idx), lr=lr, weight_decay=weight_decay)
        if new_res is not None:
            rs = slots[res]
            self._buf.scatter(rs, new_res)
            self._cache.dirty[rs] = True
            if self.below is None:  # the bottom tier counts what it stores
                self._counters["bytes_written"] += rs.size * row_bytes(self.dim)
        if new_out is not None:
            self._write_below(uniq[outside], new_out)

    def _warm_below_first(self) -> bool:
        return False

    def warm(self, keys: torch.Tensor) -> None:
        """Admit the rows of `keys` (hottest first: the first ones win when they do not all fit).

        Unknown keys get their initial rows and become part of the store.
        Keys that do not fit are passed on to `below.warm`.
        """
        self._generation += 1
        k = check_keys(keys)
        _, first = np.unique(k, return_index=True)
        ordered = k[np.sort(first)]
        if self.below is not None and self._warm_below_first():
            self.below.warm(torch.from_numpy(ordered))
        cap = self.capacity
        head = ordered if cap is None else ordered[:cap]
        if self.below is None and cap is not None:
            # Nowhere to spill: warm only what fits (a hint never raises StoreCapacityError).
            resident = self._cache.map.lookup(head) >= 0
            new = np.flatnonzero(~resident)[: self._cache.map.free_slots]
            resident[new] = True
            head = head[resident]
        slots, outside, found_out, rows_out = self._resolve(head, 1, "create")
        c = self._cache
        res = slots[slots >= 0]
        c.dirty[res] |= ~c.in_below[res]  # new rows are materialised here until written below
        tail = ordered[head.size :]
        if outside.size:
            tail = np.concatenate([head[outside], tail])
        if self.below is not None and tail.size and not self._warm_below_first():
            self.below.warm(torch.from_numpy(tail))

    def evict(self, keys: torch.Tensor) -> None:
        self._generation += 1
        k = np.unique(check_keys(keys))
        slots = self._cache.map.lookup(k)
        held = slots[slots >= 0]
        self._counters["evictions"] += held.size
        self._drop(held, write_back=False)
        if self.below is not None:
            self.below.evict(torch.from_numpy(k))

    def _materialised_slots(self) -> np.ndarray:
        c = self._cache
        live = c.map.live_slots()
        return live[c.dirty[live] | c.in_below[live]]

    def flush(self) -> None:
        """Write every dirty row below (they stay cached, clean), then flush below."""
        self._generation += 1
        if self.below is None:
            return
        c = self._cache
        live = c.map.live_slots()
        dirty = live[c.dirty[live]]
        if dirty.size:
            self._write_below(c.map.slot_keys[dirty], self._buf.gather(dirty))
            c.dirty[dirty] = False
            c.in_below[dirty] = True
        self.below.flush()

    def snapshot(self, url: str, storage_options: dict | None = None) -> int:
        """Flush, then snapshot the tier below (or this tier's rows when it is the bottom)."""
        if self.below is not None:
            self.flush()
            return self.below.snapshot(url, storage_options)
        slots = self._materialised_slots()
        keys = self._cache.map.slot_keys[slots]
        order = np.argsort(keys, kind="stable")
        keys, slots = keys[order], slots[order]
        with SnapshotWriter(url, self.dim, storage_options) as w:
            step = 1 << 16
            for lo in range(0, keys.size, step):
                r = self._buf.gather(slots[lo : lo + step])
                w.write(keys[lo : lo + step], r.emb, r.m, r.v, r.clock)
        return w.rows

    def _clear(self) -> None:
        self._generation += 1
        self._cache = SlotCache(self._cache.capacity, self._cache.policy, evict_extra=self._cache.evict_extra)
        self._buf.reset()

    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict | None = None
    ) -> int:
        check_snapshot_dim(url, self.dim, storage_options)
        self._clear()
        if self.below is not None:
            return self.below.restore(url, owner=owner, storage_options=storage_options)
        for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
            rev = b.keys[::-1]
            uniq, first_rev = np.unique(rev, return_index=True)
            last = b.keys.size - 1 - first_rev
            self.write_rows(uniq, Rows.from_numpy(b.emb, b.m, b.v, b.clock).select(last))
        return len(self)

    @property
    def tag(self) -> str | None:
        """The tag of the persistent tier at the bottom of the stack (see `SsdStore.tag`), or None."""
        return self.below.tag if self.below is not None else None

    def set_tag(self, tag: str | None) -> None:
        """Flush, then tag the persistent tier below (no-op for a stack without one)."""
        self.flush()
        if self.below is not None:
            self.below.set_tag(tag)

    def _own_stats(self) -> dict[str, Any]:
        c = self._cache
        return {
            **self._counters,
            "rows": len(c),
            "capacity": c.capacity,
            "policy": c.policy,
            "victim_scans": c.scans,
            "dirty": int(c.dirty[c.map.live_slots()].sum()),
            "device": str(self.device),
        }

    def stats(self) -> dict[str, Any]:
        out = {self.tier: self._own_stats()}
        if self.below is not None:
            for name, s in self.below.stats().items():
                key, i = name, 2
                while key in out:
                    key, i = f"{name}{i}", i + 1
                out[key] = s
        return out

    def __len__(self) -> int:
        c = self._cache
        live = c.map.live_slots()
        if self.below is None:
            return live.size
        only_here = int((c.dirty[live] & ~c.in_below[live]).sum())
        return len(self.below) + only_here

    def close(self) -> None:
        """Flush and close the tiers below; the cache is emptied."""
        if self.below is not None:
            self.flush()
            self.below.close()
        self._clear()
