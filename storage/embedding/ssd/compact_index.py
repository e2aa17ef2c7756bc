"""`CompactSlotMap`: a key -> slot map of about 12 bytes per key, for the SSD tier's 10^8-row shards.

`SlotMap` (a hash table at load <= 1/2 plus a slot -> key array) costs 32 bytes
per key: 3.2 GB for 10^8 keys, over a 2 GiB host budget.  This map keeps:

- a *main segment*: every key's 64-bit hash ``h = key * FIB mod 2^64`` (a
  bijection, so the key is recovered as ``h * FIB^-1``) sorted ascending as
  uint64, beside its slot (int32): 12 bytes per key.  Sorting by the hash, not
  the key, spreads keys uniformly (feature keys carry their field in the top
  bits), so a *directory* of the first position of each value of the top
  ``bits`` hash bits (one int32 per ~8 keys) finds a key's bucket in one read
  and a few vectorised binary-search rounds finish the lookup;
- a *delta*: a small `KeyIndex` hash for keys added since the last merge;
- tombstones: a removed main key keeps its cell with slot -1 until the next merge.

When the delta outgrows max(2^20, keys/32) it is merged into the main segment
in place (LSM style): a forward pass drops the tombstones, a backward pass
moves each main entry up by the number of delta hashes below it, chunk by
chunk, so a merge needs no second copy of the segment.  The caller places every
key (`insert`, `reassign`): the SSD tier's log allocates whole units, so the map
keeps no free list and garbage slots cost no memory.

Snapshots of the map (`save` / `load`) hold the merged segment: a header
(high water, keys), the sorted hashes and the slots, as three ``.npy`` arrays in
one file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from storage.embedding.index import MAX_SLOTS, KeyIndex

_FIB = np.uint64(0x9E3779B97F4A7C15)
_FIB_INV = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
_MIN_DELTA = 1 << 20
_CHUNK = 1 << 22
"""Entries moved per step of a merge (bounds its temporary memory to ~100 MB)."""
_KEYS_PER_BUCKET = 8


def mix(keys: np.ndarray) -> np.ndarray:
    """The uint64 hash the main segment is sorted by (a bijection of the key's 64 bits)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) * _FIB


def unmix(h: np.ndarray) -> np.ndarray:
    """Keys (int64) of hashes made by `mix`."""
    with np.errstate(over="ignore"):
        return (h * _FIB_INV).view(np.int64)


def _read_npy_into(f: BinaryIO, out: np.ndarray) -> None:
    """Read the next ``.npy`` array of `f` into `out` (same dtype and length) without a second copy."""
    version = np.lib.format.read_magic(f)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f)
    if fortran or shape != out.shape or dtype != out.dtype:
        raise ValueError(f"index array has shape {shape} dtype {dtype}, expected {out.shape} {out.dtype}")
    view = out.data.cast("B")
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])  # type: ignore[attr-defined]  # typing.BinaryIO lacks it; "rb" files have it
        if not n:
            raise ValueError(f"index file is truncated ({got} of {len(view)} bytes of an array)")
        got += n


class CompactSlotMap:
    """Keys -> slots (int32) at ~12-13 bytes per key: sorted hash segment + small hash delta.

    Same role as `storage.embedding.index.SlotMap` for a tier that never needs slot -> key
    (the SSD records carry their key) and places keys itself: `lookup`, `insert`,
    `remove`, `reassign`, `iter_items`, `save` / `load`.  Unbounded (slots up to 2^31 - 1).

    Example::

        m = CompactSlotMap()
        m.insert(np.array([7, 9]), np.array([4, 0]))
        m.lookup(np.array([9, 8, 7]))  # -> array([ 0, -1,  4])
    """

    def __init__(self) -> None:
        self._h = np.empty(0, dtype=np.uint64)
        self._s = np.empty(0, dtype=np.int32)
        self._n = 0  # main entries, tombstones included
        self._tombs = 0
        self._delta = KeyIndex(0, value_dtype=np.int32)
        self.high_water = 0
        """Slots [0, high_water) have been used (the owner sets it after renumbering every slot)."""
        self.merges = 0
        self._build_dir()

    # -- size --------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n - self._tombs + len(self._delta)

    @property
    def nbytes(self) -> int:
        """Memory held: segment (allocated capacity), directory and delta."""
        return self._h.nbytes + self._s.nbytes + self._dir.nbytes + self._delta.nbytes

    def reserve(self, n: int) -> None:
        """Allocate (and zero) the segment for `n` keys now, so adding them never reallocates it."""
        self._ensure(int(n))

    def _ensure(self, n: int) -> None:
        if n <= self._h.size:
            return
        cap = max(n, int(self._h.size * 1.25), 1024)
        # ndarray.resize reallocates in place (mremap for big blocks): no second copy of the segment.
        for name in ("_h", "_s"):
            arr = getattr(self, name)
            if arr.base is not None or not arr.flags.owndata:
                arr = arr.copy()
            arr.resize(cap, refcheck=False)
            setattr(self, name, arr)

    # -- lookups -----------------------------------------------------------------------------
    def _build_dir(self) -> None:
        n = self._n
        bits = int(max(4, min(30, np.ceil(np.log2(max(n, 1) / _KEYS_PER_BUCKET)))))
        nb = 1 << bits
        self._shift = np.uint64(64 - bits)
        counts = np.zeros(nb, dtype=np.int32)
        for lo in range(0, n, _CHUNK):
            b = (self._h[lo : min(n, lo + _CHUNK)] >> self._shift).astype(np.int64)
            first = int(b[0])
            c = np.bincount(b - first)
            counts[first : first + c.size] += c
        d = np.empty(nb + 1, dtype=np.int32)  # positions < 2^31: slots are int32, one per key
        d[0] = 0
        np.cumsum(counts, out=d[1:])
        self._dir = d

    def _lower_bound(self, h: np.ndarray) -> np.ndarray:
        """First main position whose hash is >= each of `h` (int64; `n` when none)."""
        if self._n == 0 or h.size == 0:
            return np.zeros(h.size, dtype=np.int64)
        b = (h >> self._shift).astype(np.intp)
        lo = self._dir[b].astype(np.int64)
        hi = self._dir[b + 1].astype(np.int64)
        tab = self._h
        # Binary search inside each bucket (~8 keys).
        active = np.flatnonzero(lo < hi)
        while active.size:
            l, r = lo[active], hi[active]
            mid = (l + r) >> 1
            go = tab[mid] < h[active]
            l = np.where(go, mid + 1, l)
            r = np.where(go, r, mid)
            lo[active] = l
            hi[active] = r
            active = active[l < r]
        return lo

    def _find_main(self, h: np.ndarray) -> np.ndarray:
        """Position of each hash in the main segment, -1 when absent."""
        n = self._n
        if n == 0 or h.size == 0:
            return np.full(h.size, -1, dtype=np.int64)
        lo = self._lower_bound(h)
        ok = lo < n
        ok[ok] = self._h[lo[ok]] == h[ok]
        lo[~ok] = -1
        return lo

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Slot of each key (int64), -1 when absent; duplicates allowed."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        pos = self._find_main(mix(keys))
        out = np.full(keys.size, -1, dtype=np.int64)
        ok = pos >= 0
        out[ok] = self._s[pos[ok]]  # a tombstone reads -1
        if len(self._delta):
            need = np.flatnonzero(out < 0)
            if need.size:
                out[need] = self._delta.get(keys[need])
        return out

    # -- changes ------------------------------------------------------------------------------
    def insert(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Place `keys` (distinct, absent) at caller-chosen `slots` (distinct, unused); raises the high water."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        self._raise_high_water(slots)
        self._delta.insert(keys, slots)
        if len(self._delta) > max(_MIN_DELTA, len(self) >> 5):
            self.merge()

    def _raise_high_water(self, slots: np.ndarray) -> None:
        top = int(slots.max()) + 1
        if top > MAX_SLOTS:
            raise ValueError(f"CompactSlotMap cannot address more than {MAX_SLOTS} slots")
        self.high_water = max(self.high_water, top)

    def remove(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Forget `keys` (distinct); returns (present mask, the slots the present ones had)."""
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = np.full(keys.size, -1, dtype=np.int64)
        pos = self._find_main(mix(keys))
        inmain = pos >= 0
        slots[inmain] = self._s[pos[inmain]]
        live = np.flatnonzero(slots >= 0)
        self._s[pos[live]] = -1
        self._tombs += live.size
        if len(self._delta):
            rest = np.flatnonzero(slots < 0)
            if rest.size:
                slots[rest] = self._delta.remove(keys[rest])
        ok = slots >= 0
        return ok, slots[ok]

    def reassign(self, keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Point present `keys` (distinct) at new `slots`; returns their old slots.

        Slots at or above the high water raise it.

        Raises:
            KeyError: a key is not in the map (keys of the main segment may already point at
                their new slots: callers check presence first).
        """
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        slots = np.ascontiguousarray(slots, dtype=np.int64)
        if keys.size == 0:
            return np.empty(0, dtype=np.int64)
        old = np.full(keys.size, -1, dtype=np.int64)
        pos = self._find_main(mix(keys))
        inmain = pos >= 0
        old[inmain] = self._s[pos[inmain]]
        m = np.flatnonzero(old >= 0)
        self._s[pos[m]] = slots[m]
        rest = np.flatnonzero(old < 0)
        if rest.size:
            old[rest] = self._delta.remove(keys[rest])
            if (old[rest] < 0).any():
                raise KeyError(f"reassign: {int((old[rest] < 0).sum())} keys are not in the map")
            self._delta.insert(keys[rest], slots[rest])
        self._raise_high_water(slots)
        return old

    def merge(self) -> None:
        """Fold the delta into the main segment and drop tombstones (in place, chunk by chunk)."""
        h, s = self._h, self._s
        n = self._n
        if self._tombs:
            w = 0
            for lo in range(0, n, _CHUNK):
                cs = s[lo : min(n, lo + _CHUNK)]
                alive = cs >= 0
                k = int(alive.sum())
                h[w : w + k] = h[lo : lo + cs.size][alive]
                s[w : w + k] = cs[alive]
                w += k
            n = self._n = w
            self._tombs = 0
            self._build_dir()
        if len(self._delta):
            dk, dv = self._delta.items()
            dh = mix(dk)
            order = np.argsort(dh)
            dh, dv = dh[order], dv[order].astype(np.int32)
            del dk, order
            m = dh.size
            ins = self._lower_bound(dh)  # old main entries below each delta hash (non-decreasing)
            self._ensure(n + m)
            h, s = self._h, self._s
            # Backward: main entry i moves up by #{j: ins[j] <= i} (the delta hashes below it), so a
            # chunk's targets lie above every entry not yet moved.
            first = int(ins[0])
            hi = n
            while hi > first:
                lo = max(first, hi - _CHUNK)
                a, b = np.searchsorted(ins, [lo, hi], side="right")
                shift = np.bincount(ins[a:b] - lo, minlength=hi - lo)[: hi - lo]
                np.cumsum(shift, out=shift)
                shift += a
                newpos = shift + np.arange(lo, hi)
                h[newpos] = h[lo:hi].copy()
                s[newpos] = s[lo:hi].copy()
                hi = lo
            at = ins + np.arange(m)
            h[at] = dh
            s[at] = dv
            self._n = n + m
            self._delta = KeyIndex(0, value_dtype=np.int32)
            self._build_dir()
        self.merges += 1

    # -- whole-map views ------------------------------------------------------------------------
    def iter_items(self, batch: int = 1 << 20) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Merge, then yield (keys int64, slots int64) of every key, in hash order, `batch` at a time."""
        self.merge()
        for lo in range(0, self._n, batch):
            hi = min(self._n, lo + batch)
            yield unmix(self._h[lo:hi]), self._s[lo:hi].astype(np.int64)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, f: BinaryIO) -> None:
        """Write the merged map to the open binary file `f` (header, hashes, slots)."""
        self.merge()
        np.save(f, np.array([self.high_water, self._n], dtype=np.int64))
        np.save(f, self._h[: self._n])
        np.save(f, self._s[: self._n])

    def load(self, f: BinaryIO) -> None:
        """Replace the content with a map written by `save`.

        Raises:
            ValueError: the file is truncated, or its hashes are not strictly increasing
                (corrupt), or a slot is out of range.
        """
        hdr = np.load(f)
        if hdr.shape != (2,):
            raise ValueError(f"index header has shape {hdr.shape}, expected (2,)")
        high_water, n = int(hdr[0]), int(hdr[1])
        self.__init__()  # type: ignore[misc]
        self._ensure(n)
        _read_npy_into(f, self._h[:n])
        _read_npy_into(f, self._s[:n])
        self._n = n
        self.high_water = high_water
        self._check()

    def _check(self) -> None:
        n, hw = self._n, self.high_water
        for lo in range(0, n, _CHUNK):
            hi = min(n, lo + _CHUNK)
            c = self._h[max(0, lo - 1) : hi]
            if c.size > 1 and not (c[1:] > c[:-1]).all():
                raise ValueError("index holds a key twice or is not sorted (corrupt index file)")
            s = self._s[lo:hi]
            if s.size and (int(s.min()) < 0 or int(s.max()) >= hw):
                raise ValueError(f"index slot out of range [0, {hw})")
        self._build_dir()
