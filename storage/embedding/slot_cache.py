"""`SlotCache`: the replacement-policy bookkeeping of a bounded row cache (NumPy only, no rows).

It maps keys to slots and keeps, per slot, the access count and last-access tick
packed in one int64 (``freq << 33 | tick``: the LFU order with recency as the
tie-break, so a touch reads and writes one word per row), and the flags a
write-back tier needs (`dirty`, `in_below`).  It holds no rows, so
`simulate_hit_rate(s)` can replay a key stream through exactly the policy the
caching tiers run (`storage.embedding.caching_tier`).
"""

from __future__ import annotations

import numpy as np

from storage.embedding.config import POLICIES
from storage.embedding.index import INITIAL_SLOTS, SlotMap

_FREQ_CAP = (1 << 30) - 1
_TICK_BITS = 33
"""A slot's score is ``freq << 33 | last_tick``: the LFU order (ties by recency) as one int64."""
_ONE_ACCESS = np.int64(1 << _TICK_BITS)
_TICK_MASK = np.int64((1 << _TICK_BITS) - 1)
_FREQ_MASK = ~_TICK_MASK


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

    # Per slot, (re)allocated by `_grow`: the packed score, and the write-back flags.
    _score: np.ndarray
    dirty: np.ndarray
    in_below: np.ndarray

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
        self._grow(min(capacity or 0, INITIAL_SLOTS))  # grown with the slots in use, up to `capacity`

    def _grow(self, n: int) -> None:
        old = getattr(self, "_score", np.empty(0, dtype=np.int64)).size
        if n <= old and old:
            return
        n = max(n, 2 * old, 1024)
        if self.capacity is not None:
            n = max(min(n, self.capacity), old)
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
