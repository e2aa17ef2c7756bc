"""`CachingTier`: a bounded write-back cache of full rows over an optional tier below.

`HostStore` (CPU memory under a byte budget) and `DeviceCache` (rows on the
training device) are this tier with different capacities and placement.  It
keeps full rows (weights + optimizer state) in a `RowBuffer`, inclusive and
write-back, so moving rows up and down never loses optimizer state:

- a row read from below is admitted clean (`in_below`); an update makes it dirty;
- admission and eviction happen once per call, for the whole batch (the policy is
  `storage.embedding.slot_cache.SlotCache`); the keys of the current call are never
  victims; dirty victims go below in one `write_rows` call;
- keys that do not fit (a batch larger than the cache) pass through to below;
- `lookup` of an unknown key returns its `init_rows` row without storing it.

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

from storage.embedding.base import EmbeddingStore, Lookup, as_row_format
from storage.embedding.row_format import RowFormat
from storage.embedding.row_init import init_rows
from storage.embedding.rows import (
    RowBuffer,
    Rows,
    check_keys,
    check_update,
    host_to_device,
    strictly_increasing,
    sum_duplicates,
)
from storage.embedding.slot_cache import SlotCache
from storage.embedding.snapshot import (
    SnapshotWriter,
    check_snapshot_dim,
    iter_snapshot,
)


class StoreCapacityError(RuntimeError):
    """A tier with no tier below ran out of room for rows it must keep."""


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
        dim: the rows' `RowFormat` (an int: its width, fp32 rows with Adam).
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
        dim: int | RowFormat,
        *,
        init_std: float,
        device: torch.device | str,
        capacity: int | None,
        policy: str,
        below: EmbeddingStore | None,
        preallocate: bool = False,
        evict_extra: float = 0.0,
    ) -> None:
        fmt = as_row_format(dim)
        if not init_std > 0:
            raise ValueError(f"init_std must be > 0, got {init_std}")
        if below is not None:
            if not isinstance(below, EmbeddingStore):
                raise TypeError(f"below must be an EmbeddingStore (a storage tier), got {type(below).__name__}")
            if below.row_format != fmt:
                raise ValueError(f"below keeps rows {below.row_format}, this tier {fmt}")
        self.row_format = fmt
        self.dim = fmt.dim
        self._row_bytes = fmt.row_bytes()
        self.init_std = init_std
        self.device = torch.device(device)
        self.below = below
        self._cache = SlotCache(capacity, policy, evict_extra=evict_extra)
        self._buf = RowBuffer(
            fmt, self.device, capacity if (preallocate and capacity) else 0, fixed=preallocate, limit=capacity
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
            fresh = self.row_format.fresh(init_rows(torch.from_numpy(keys), self.dim, self.init_std))
            return np.zeros(keys.size, dtype=bool), fresh
        found, rows = self.below.read_rows(keys)
        self._counters["bytes_read"] += int(found.sum()) * self._row_bytes
        return found, rows

    def _write_below(self, keys: np.ndarray, rows: Rows) -> None:
        if keys.size == 0:
            return
        if self.below is None:
            raise StoreCapacityError("no tier below to write rows to")  # unreachable: unbounded without below
        self.below.write_rows(keys, rows)
        self._counters["bytes_written"] += keys.size * self._row_bytes

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
        self,
        keys: np.ndarray,
        counts: np.ndarray | int,
        mode: str,
        *,
        slots: np.ndarray | None = None,
        below: tuple[np.ndarray, Rows | None] | None = None,
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
                self._counters["bytes_read"] += int(found.sum()) * self._row_bytes if self.below is not None else 0
            else:
                found, rows = self._read_below(mkeys)
            want = found if mode == "read" else np.ones(miss.size, dtype=bool)
            want_idx = np.flatnonzero(want)
            mcounts = counts[miss] if isinstance(counts, np.ndarray) else np.ones(miss.size, dtype=np.int64)
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
        c.touch(slots[res], counts[res] if isinstance(counts, np.ndarray) else counts)
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
        assert rows_out is not None  # only a "write" resolve leaves the rows outside the cache unread
        rows = self.row_format.empty(keys.size, self.device)
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
            self._counters["bytes_written"] += res.size * self._row_bytes
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
        counts: np.ndarray | int
        if distinct:  # already np.unique's output: no sort, and `slots` need no second hashing
            uniq, inverse, counts = k, None, 1
            slots, outside, found_out, rows_out = self._resolve(uniq, counts, "read", slots=slots)
            plan = self._plan(slots, found_out, rows_out)
        else:
            uniq, inverse, counts = np.unique(k, return_inverse=True, return_counts=True)
            slots, outside, _, rows_out = self._resolve(uniq, counts, "read")
        if outside.size == 0:  # all resident: one gather straight into the caller's order
            return Lookup(
                handle_keys, self._buf.gather_emb(slots if inverse is None else slots[inverse.reshape(-1)]), plan
            )
        assert rows_out is not None  # only a "write" resolve leaves the rows outside the cache unread
        out = torch.empty((uniq.size, self.dim), dtype=torch.float32, device=self.device)
        res = np.flatnonzero(slots >= 0)
        dev = self.device
        out.index_copy_(0, host_to_device(torch.from_numpy(res), dev), self._buf.gather_emb(slots[res]))
        out.index_copy_(
            0, host_to_device(torch.from_numpy(outside), dev), self._buf.fmt.weights(host_to_device(rows_out.emb, dev))
        )
        if inverse is None:
            return Lookup(handle_keys, out, plan)
        return Lookup(
            handle_keys, out.index_select(0, host_to_device(torch.from_numpy(inverse.reshape(-1)), dev)), plan
        )

    def _plan(self, slots: np.ndarray, found_out: np.ndarray, rows_out: Rows | None) -> _Plan:
        return _Plan(id(self), self._generation, slots, found_out, rows_out)

    def update(
        self, target: torch.Tensor | Lookup, grads: torch.Tensor, *, lr: float, weight_decay: float = 0.0
    ) -> None:
        plan = target.plan if isinstance(target, Lookup) else None
        if not (isinstance(plan, _Plan) and plan.tier == id(self) and plan.generation == self._generation):
            plan = None  # another tier's, or the tier changed since the lookup: resolve afresh
        self._generation += 1
        keys = target.keys if isinstance(target, Lookup) else target
        # on a GPU the new rows' one finiteness check (`RowFormat.step`) also refuses non-finite gradients
        k = check_update(keys, grads, self.dim, lr=lr, weight_decay=weight_decay, finite=self.device.type == "cpu")
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
        # Compute every new row first (`RowFormat.step` refuses non-finite results), then write: a
        # refused update changes no value here or below, and admits no key it was to create.
        new_res = new_out = None
        try:
            if res.size:
                idx = host_to_device(torch.from_numpy(res), self.device)
                new_res = self.row_format.step(
                    host_to_device(torch.from_numpy(uniq[res]), self.device),
                    self._buf.gather(slots[res]),
                    g.index_select(0, idx),
                    lr=lr,
                    weight_decay=weight_decay,
                )
            if outside.size:
                assert rows_out is not None  # only a "write" resolve leaves the rows outside the cache unread
                idx = host_to_device(torch.from_numpy(outside), self.device)
                new_out = self.row_format.step(
                    host_to_device(torch.from_numpy(uniq[outside]), self.device),
                    rows_out.to(self.device),
                    g.index_select(0, idx),
                    lr=lr,
                    weight_decay=weight_decay,
                )
        except ValueError:
            c = self._cache
            admitted = slots[res]
            unwritten = admitted[~c.dirty[admitted] & ~c.in_below[admitted]]
            c.map.remove(c.map.slot_keys[unwritten])
            raise
        if new_res is not None:
            rs = slots[res]
            self._buf.scatter(rs, new_res)
            self._cache.dirty[rs] = True
            if self.below is None:  # the bottom tier counts what it stores
                self._counters["bytes_written"] += rs.size * self._row_bytes
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
        slots: np.ndarray = live[c.dirty[live] | c.in_below[live]]
        return slots

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

    def snapshot(self, url: str, storage_options: dict[str, Any] | None = None) -> int:
        """Flush, then snapshot the tier below (or this tier's rows when it is the bottom)."""
        if self.below is not None:
            self.flush()
            return self.below.snapshot(url, storage_options)
        slots = self._materialised_slots()
        keys = self._cache.map.slot_keys[slots]
        order = np.argsort(keys, kind="stable")
        keys, slots = keys[order], slots[order]
        with SnapshotWriter(url, self.row_format, storage_options) as w:
            step = 1 << 16
            for lo in range(0, keys.size, step):
                w.write(keys[lo : lo + step], self._buf.gather(slots[lo : lo + step]))
        return w.rows

    def _clear(self, *, release: bool = False) -> None:
        """Forget every row; the buffer is zeroed in place (`RowBuffer.reset`), or freed on close."""
        self._generation += 1
        self._cache = SlotCache(self._cache.capacity, self._cache.policy, evict_extra=self._cache.evict_extra)
        if release:
            self._buf.release()
        else:
            self._buf.reset()

    def restore(
        self, url: str, *, owner: tuple[int, int] | None = None, storage_options: dict[str, Any] | None = None
    ) -> int:
        check_snapshot_dim(url, self.dim, storage_options)
        self._clear()
        if self.below is not None:
            return self.below.restore(url, owner=owner, storage_options=storage_options)
        for b in iter_snapshot(url, owner=owner, storage_options=storage_options):
            rev = b.keys[::-1]
            uniq, first_rev = np.unique(rev, return_index=True)
            last = b.keys.size - 1 - first_rev
            self.write_rows(uniq, b.select(last).rows_as(self.row_format))
        return len(self)

    @property
    def tag(self) -> str | None:
        """The tag of the persistent tier at the bottom of the stack (see `SsdStore.tag`); None without
        one, or while this tier holds changes not written down yet (its content is no longer the tagged one)."""
        if self.below is None or self._cache.dirty.any():
            return None
        return self.below.tag

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
        """Flush and close the tiers below; the cache is emptied and its buffer freed."""
        if self.below is not None:
            self.flush()
            self.below.close()
        self._clear(release=True)
