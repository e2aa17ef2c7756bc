"""`CachingTier`: a bounded write-back cache of full rows over an optional tier below.

`HostStore` (CPU memory under a byte budget) and `DeviceCache` (rows on the
training device) are this tier with different capacities and placement.  It
keeps full rows (weights + optimizer state) in a `RowBuffer`, inclusive and
write-back, so moving rows up and down never loses optimizer state:

- a row read from below is admitted clean (`in_below`); an update makes it dirty;
- admission and eviction happen once per call, for the whole batch (the policy is
  `storage.embedding.slot_cache.SlotCache`; the rows and their moves to and from below,
  `storage.embedding.resident_rows.ResidentRows`); the keys of the current call are never
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
from storage.embedding.resident_rows import ResidentRows
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.checks import check_keys, check_update, strictly_increasing
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.segments import sum_duplicates
from storage.embedding.rows.transfer import host_to_device, is_host
from storage.embedding.snapshot import (
    SnapshotWriter,
    check_snapshot_dim,
    iter_snapshot,
)


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
        self._resident = ResidentRows(
            fmt,
            tier=self.tier,
            init_std=init_std,
            device=self.device,
            capacity=capacity,
            policy=policy,
            below=below,
            preallocate=preallocate,
            evict_extra=evict_extra,
        )
        self._buf = self._resident.buf
        self._counters = self._resident.counters
        self._generation = 0
        """Counts the calls that change the tier: a `Lookup.plan` is reusable while this is unchanged."""
        self._refused: torch.Tensor | None = None
        """A tier off the host: whether an update since the last `check_updates` was refused (a bool on the device)."""

    @property
    def capacity(self) -> int | None:
        """Rows this tier holds at most (None: unbounded)."""
        return self._resident.cache.capacity

    @property
    def policy(self) -> str:
        """Replacement policy, `lfu` or `lru`."""
        return self._resident.cache.policy

    # -- tier-to-tier interface ----------------------------------------------------------
    def read_rows(self, keys: np.ndarray) -> tuple[np.ndarray, Rows]:
        self._generation += 1
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots, outside, found_out, rows_out = self._resident.resolve(keys, 1, "read")
        res = np.flatnonzero(slots >= 0)
        found = np.ones(keys.size, dtype=bool)
        found[outside] = found_out
        if outside.size == 0:
            return found, self._buf.gather(slots)
        assert rows_out is not None  # noqa: S101 - only a "write" resolve leaves the rows outside the cache unread
        rows = self.row_format.empty(keys.size, self.device)
        rows.put(res, self._buf.gather(slots[res]))
        rows.put(outside, rows_out)
        return found, rows

    def write_rows(self, keys: np.ndarray, rows: Rows) -> None:
        self._generation += 1
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots, outside, _, _ = self._resident.resolve(keys, 1, "write")
        res = np.flatnonzero(slots >= 0)
        self._buf.scatter(slots[res], rows.select(res))
        self._resident.cache.dirty[slots[res]] = True
        if self.below is None:
            self._counters["bytes_written"] += res.size * self._row_bytes
        if outside.size:
            self._resident.write_below(keys[outside], rows.select(outside))

    def contains(self, keys: np.ndarray) -> np.ndarray:
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        held = self._resident.cache.map.lookup(keys) >= 0
        if self.below is not None and not held.all():
            held[~held] = self.below.contains(keys[~held])
        return held

    def prefetch(self, keys: np.ndarray) -> None:
        """Pass the keys this tier does not hold to the tier below (`EmbeddingStore.prefetch`)."""
        if self.below is None:
            return
        k = np.unique(np.ascontiguousarray(keys, dtype=np.int64))
        self.below.prefetch(k[self._resident.cache.map.lookup(k) < 0])

    # -- contract ----------------------------------------------------------------------------
    def lookup(self, keys: torch.Tensor) -> Lookup:
        """Rows of `keys`; for keys that are sorted and distinct (a sharded pull's) the `Lookup` carries
        what was resolved, for an `update` of it right after (`_Plan`)."""
        self._generation += 1
        k = check_keys(keys)
        handle_keys = torch.from_numpy(k.copy())
        c = self._resident.cache
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
            slots, outside, found_out, rows_out = self._resident.resolve(uniq, counts, "read", slots=slots)
            plan = self._plan(slots, found_out, rows_out)
        else:
            uniq, inverse, counts = np.unique(k, return_inverse=True, return_counts=True)
            slots, outside, _, rows_out = self._resident.resolve(uniq, counts, "read")
        if outside.size == 0:  # all resident: one gather straight into the caller's order
            return Lookup(
                handle_keys, self._buf.gather_emb(slots if inverse is None else slots[inverse.reshape(-1)]), plan
            )
        assert rows_out is not None  # noqa: S101 - only a "write" resolve leaves the rows outside the cache unread
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
        # Off the host (a GPU) an update reads nothing of the device: the new rows' finiteness, which also
        # refuses non-finite gradients, stays a flag on the device that keeps the old rows where it is False,
        # read by `check_updates` (at `flush` and the trainer's log steps) instead of here.
        deferred = not is_host(self.device)
        k = check_update(keys, grads, self.dim, lr=lr, weight_decay=weight_decay, finite=not deferred)
        if k.size == 0:
            return
        uniq, g = sum_duplicates(k, grads.to(self.device))
        if uniq is k:  # sorted distinct keys: each occurs once
            counts: np.ndarray | int = 1
        else:
            counts = np.unique(k, return_counts=True)[1]
        if plan is not None and uniq is k:
            # the same keys as the lookup just before: its slots and rows read below still hold
            slots, outside, _, rows_out = self._resident.resolve(
                uniq, counts, "create", slots=plan.slots.copy(), below=(plan.found_out, plan.rows_out)
            )
        else:
            slots, outside, _, rows_out = self._resident.resolve(uniq, counts, "create")
        res = np.flatnonzero(slots >= 0)
        # Compute every new row first (`RowFormat.step` refuses non-finite results), then write: a
        # refused update changes no value here or below, and admits no key it was to create (deferred: the
        # keys it created stay, with their initial rows).
        new_res = new_out = old_res = old_out = None
        ok_res = ok_out = None
        try:
            if res.size:
                old_res = self._buf.gather(slots[res])
                new_res, ok_res = self._step_rows(uniq[res], old_res, g, res, lr, weight_decay, deferred)
            if outside.size:
                assert rows_out is not None  # noqa: S101 - an invariant
                old_out = rows_out.to(self.device)
                new_out, ok_out = self._step_rows(uniq[outside], old_out, g, outside, lr, weight_decay, deferred)
        except ValueError:
            c = self._resident.cache
            admitted = slots[res]
            unwritten = admitted[~c.dirty[admitted] & ~c.in_below[admitted]]
            c.map.remove(c.map.slot_keys[unwritten])
            raise
        if deferred:
            flags = [f for f in (ok_res, ok_out) if f is not None]
            ok = flags[0] if len(flags) == 1 else flags[0] & flags[1]
            new_res, new_out = _kept(ok, new_res, old_res), _kept(ok, new_out, old_out)
            self._refused = ~ok if self._refused is None else self._refused | ~ok
        if new_res is not None:
            rs = slots[res]
            self._buf.scatter(rs, new_res)
            self._resident.cache.dirty[rs] = True
            if self.below is None:  # the bottom tier counts what it stores
                self._counters["bytes_written"] += rs.size * self._row_bytes
        if new_out is not None:
            self._resident.write_below(uniq[outside], new_out)

    def _step_rows(
        self,
        keys: np.ndarray,
        rows: Rows,
        g: torch.Tensor,
        pos: np.ndarray,
        lr: float,
        weight_decay: float,
        deferred: bool,
    ) -> tuple[Rows, torch.Tensor | None]:
        """The new rows of `keys` (`rows`, their gradients `g[pos]`) and, `deferred`, whether all are finite (a
        device bool, `RowFormat.step_unchecked`); else checked here (`RowFormat.step` raises `ValueError`)."""
        dev = self.device
        args = (
            host_to_device(torch.from_numpy(keys), dev),
            rows,
            g.index_select(0, host_to_device(torch.from_numpy(pos), dev)),
        )
        if deferred:
            return self.row_format.step_unchecked(*args, lr=lr, weight_decay=weight_decay)
        return self.row_format.step(*args, lr=lr, weight_decay=weight_decay), None

    def check_updates(self) -> None:
        """Raise the refusal of an update this tier deferred (a tier off the host reads nothing of the device in
        `update`), then the tier below's; one host read, clearing the flag.

        Raises:
            ValueError: an update since the last check had a NaN or inf gradient, or would have made rows
                non-finite; it changed no row (the keys it created hold their initial rows).
        """
        refused, self._refused = self._refused, None
        if refused is not None and bool(refused):  # host read: the deferred finiteness of the updates
            raise ValueError(
                f"an update of the {self.tier} tier since its last check had NaN or inf gradients, or would have made "
                f"rows non-finite in {self.row_format.row_dtype}: it changed no row (the keys it created hold their "
                "initial rows); clip the gradients, or look for the step whose loss went non-finite"
            )
        if self.below is not None:
            self.below.check_updates()

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
            resident = self._resident.cache.map.lookup(head) >= 0
            new = np.flatnonzero(~resident)[: self._resident.cache.map.free_slots]
            resident[new] = True
            head = head[resident]
        slots, outside, found_out, rows_out = self._resident.resolve(head, 1, "create")
        c = self._resident.cache
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
        slots = self._resident.cache.map.lookup(k)
        held = slots[slots >= 0]
        self._counters["evictions"] += held.size
        self._resident.drop(held, write_back=False)
        if self.below is not None:
            self.below.evict(torch.from_numpy(k))

    def flush(self) -> None:
        """Write every dirty row below (they stay cached, clean), then flush below.

        Raises:
            ValueError: an update since the last check was refused (`check_updates`); nothing is written.
        """
        self._generation += 1
        self.check_updates()
        if self.below is None:
            return
        self._resident.write_dirty()
        self.below.flush()

    def snapshot(self, url: str, storage_options: dict[str, Any] | None = None) -> int:
        """Flush, then snapshot the tier below (or this tier's rows when it is the bottom)."""
        if self.below is not None:
            self.flush()
            return self.below.snapshot(url, storage_options)
        slots = self._resident.materialised_slots()
        keys = self._resident.cache.map.slot_keys[slots]
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
        self._refused = None
        self._resident.clear(release=release)

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
        if self.below is None or self._resident.cache.dirty.any():
            return None
        return self.below.tag

    def set_tag(self, tag: str | None) -> None:
        """Flush, then tag the persistent tier below (no-op for a stack without one)."""
        self.flush()
        if self.below is not None:
            self.below.set_tag(tag)

    def _own_stats(self) -> dict[str, Any]:
        c = self._resident.cache
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
        c = self._resident.cache
        live = c.map.live_slots()
        if self.below is None:
            return live.size
        only_here = int((c.dirty[live] & ~c.in_below[live]).sum())
        return len(self.below) + only_here

    def close(self) -> None:
        """Flush and close the tiers below; the cache is emptied and its buffer freed.  A refused update not
        checked yet is dropped, not raised: closing is what a failed run's cleanup does."""
        self._refused = None
        if self.below is not None:
            self.flush()
            self.below.close()
        self._clear(release=True)


def _kept(ok: torch.Tensor, new: Rows | None, old: Rows | None) -> Rows | None:
    """`new` where the device bool `ok` is True, else `old` (a refused update keeps every old row)."""
    if new is None or old is None:
        return new
    return new.like([torch.where(ok, n, o) for n, o in zip(new.tensors(), old.tensors(), strict=True)])
