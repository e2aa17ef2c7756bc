"""The warm stage: bring this node's SSD shards to the published model's state before training.

For each local rank:

1. open its SSD shard (`<local_dir>/<model>/shard-RRRRR-of-WWWWW`);
2. keep it when its tag equals `snapshot_tag` (the published model's run tag);
   otherwise wipe it and restore the rows it owns from `snapshot_url` (a model's
   ``sparse/`` directory, written by any world size), or leave it empty when
   there is no published model.  The snapshot is read once for all the ranks
   that need it, one row group at a time;
3. drop the vocabulary's evicted keys (and compact when a quarter of the file is holes);
4. tag the shard with `snapshot_tag`;
5. write the rank's working set (the day's keys it owns, hottest first, cut to
   what fits the host budget) to ``<shard>/working_set.npy`` for the trainer's
   `store.warm(...)`.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from storage.base import owner_of
from storage.config import StoreConfig
from storage.host import rows_for_budget
from storage.rows import Rows
from storage.snapshot import iter_snapshot, snapshot_dim
from storage.ssd import SsdStore
from storage.tiered import shard_dir_for

log = logging.getLogger(__name__)

WORKING_SET = "working_set.npy"
"""File name of a rank's working set inside its shard directory."""
COMPACT_FRACTION = 0.25
"""Compact a shard when at least this fraction of its slots are holes."""


def _open(shard: str, store: StoreConfig) -> SsdStore:
    try:
        return SsdStore(shard, store.embedding_dim, init_std=store.init_std)
    except ValueError as exc:
        # Another dim or an old layout: the shard is a cache of a snapshot, so start it over.
        log.warning("discarding shard %s: %s", shard, exc)
        shutil.rmtree(shard)
        return SsdStore(shard, store.embedding_dim, init_std=store.init_std)


def _ordered_unique(keys: np.ndarray) -> np.ndarray:
    """Distinct keys in order of first appearance."""
    _, first = np.unique(keys, return_index=True)
    return keys[np.sort(first)]


def _save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:12]}")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def _restore_many(shards: dict[int, SsdStore], url: str, world: int, storage_options: dict | None) -> None:
    """Wipe `shards` (rank -> store) and fill each with the rows of `url` it owns, in one pass over `url`."""
    d = snapshot_dim(url, storage_options)
    dims = {s.dim for s in shards.values()}
    if d is not None and dims != {d}:
        raise ValueError(f"snapshot {url} has dim {d}, the shards have dim {sorted(dims)}; fix store.embedding_dim")
    for s in shards.values():
        s.wipe()
    ranks = np.array(sorted(shards), dtype=np.int64)
    for b in iter_snapshot(url, storage_options=storage_options):
        own = owner_of(b.keys, world)
        for rank in ranks[np.isin(ranks, own)].tolist():
            mine = np.flatnonzero(own == rank)
            keys = b.keys[mine]
            rev = keys[::-1]
            uniq, first_rev = np.unique(rev, return_index=True)
            sel = mine[keys.size - 1 - first_rev]  # later rows win
            rows = Rows.from_numpy(b.emb[sel], b.m[sel], b.v[sel], b.clock[sel])
            shards[rank].write_rows(uniq, rows)


def warm_shards(
    *,
    local_dir: str,
    model_name: str,
    world_size: int,
    ranks: list[int],
    store: StoreConfig,
    snapshot_url: str | None,
    snapshot_tag: str | None,
    evict_keys: np.ndarray,
    working_set: np.ndarray,
    storage_options: dict | None = None,
) -> dict[str, Any]:
    """Prepare the SSD shards of `ranks` for a training run (see the module docstring).

    Args:
        local_dir: node-local folder of the shards.
        model_name: the model's folder under `local_dir`.
        world_size: ranks in the training job (the owner of key k is `k % world_size`).
        ranks: the ranks whose shards live on this node.
        store: the store configuration (dim, init std, host budget).
        snapshot_url: the published model's ``sparse/`` directory (or one file), or None.
        snapshot_tag: the published model's tag; a shard already tagged with it is kept.
        evict_keys: keys the vocabulary dropped (int64, any owner).
        working_set: the day's keys, hottest first (int64, any owner).
        storage_options: fsspec options for `snapshot_url`.

    Returns:
        ``{"world_size", "snapshot_url", "snapshot_tag", "seconds", "rows", "ranks": [per rank:
        {"rank", "shard_dir", "rows", "restored", "evicted", "working_set_keys",
        "working_set_fits", "seconds"}]}`` where `working_set_fits` is the fraction of
        the rank's working set that fits the host budget (the file holds that part).

    Raises:
        ValueError: bad ranks / world size, or a snapshot of another dim.
        FileNotFoundError: `snapshot_url` does not exist.
    """
    t_start = time.perf_counter()
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks must be distinct, got {ranks}")
    shard_dirs = {r: shard_dir_for(local_dir, model_name, r, world_size) for r in ranks}  # validates
    evict_keys = np.ascontiguousarray(evict_keys, dtype=np.int64).reshape(-1)
    working_set = np.ascontiguousarray(working_set, dtype=np.int64).reshape(-1)
    capacity = rows_for_budget(store.host_budget_mb << 20, store.embedding_dim)

    shards: dict[int, SsdStore] = {}
    reports: dict[int, dict[str, Any]] = {}
    try:
        for r in ranks:
            shards[r] = _open(shard_dirs[r], store)
            reports[r] = {"rank": r, "shard_dir": shard_dirs[r], "restored": False, "seconds": 0.0}
        stale = {r: s for r, s in shards.items() if snapshot_tag is None or s.tag != snapshot_tag}
        if stale:
            t0 = time.perf_counter()
            if snapshot_url is not None:
                _restore_many(stale, snapshot_url, world_size, storage_options)
                for r in stale:
                    reports[r]["restored"] = True
            else:
                for s in stale.values():
                    s.wipe()
            share = (time.perf_counter() - t0) / len(stale)
            for r in stale:
                reports[r]["seconds"] += share
        for r in ranks:
            t0 = time.perf_counter()
            s = shards[r]
            ek = evict_keys[owner_of(evict_keys, world_size) == r]
            evicted = int(s.contains(ek).sum()) if ek.size else 0
            if evicted:
                s.evict(torch.from_numpy(ek))
                st = s.stats()["ssd"]
                if st["free_slots"] >= COMPACT_FRACTION * max(1, st["slots"]):
                    s.compact()
            s.set_tag(snapshot_tag)
            ws = _ordered_unique(working_set[owner_of(working_set, world_size) == r])
            keep = ws[:capacity]
            _save_npy_atomic(Path(shard_dirs[r]) / WORKING_SET, keep)
            reports[r].update(
                rows=len(s),
                evicted=evicted,
                working_set_keys=int(keep.size),
                working_set_fits=float(min(1.0, capacity / ws.size)) if ws.size else 1.0,
            )
            s.close()
            reports[r]["seconds"] = round(reports[r]["seconds"] + time.perf_counter() - t0, 4)
    finally:
        for s in shards.values():
            s.close()
    out = [reports[r] for r in ranks]
    log.info("warmed %d shards of %s (restored %d)", len(out), model_name, sum(x["restored"] for x in out))
    return {
        "world_size": world_size,
        "snapshot_url": snapshot_url,
        "snapshot_tag": snapshot_tag,
        "rows": sum(x["rows"] for x in out),
        "seconds": round(time.perf_counter() - t_start, 4),
        "ranks": out,
    }
