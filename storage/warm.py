"""Warm: bring a node's SSD shards to the published model's state before training.

One module for every side of it:

- `WarmPlan`: what warming for a day needs (the published snapshot and its run tag, the
  vocabulary's evicted keys, the day's working set, and a token naming this warm); built once by
  the flow's warm stage and carried in the train spec;
- `warm_shards`: the work, for any set of ranks of a node (the flow's warm stage on its own node);
- `ensure_warm`: a rank's check at start-up: when its shard's token differs from the plan's
  (a node the flow did not run on), it warms its own shard with `warm_shards`;
- `node_ranks` / `group_rank`: which ranks a node of a c10d job gets (`ctrpipe warm-node`, run by
  the Slurm and Kubernetes job before torchrun).

`warm_shards`, for each rank:

1. open its SSD shard (`NodeLayout.shard`); one of another row format or record layout (the 0.1.0 release's
   `ctr-ssd-shard/2`) that holds the published model's rows is converted where it lies
   (`storage.embedding.ssd.upgrade`), any other is wiped;
2. keep it when its tag equals the plan's `snapshot_tag` (the published model's run tag) and it
   holds rows of the day's format; otherwise wipe it and restore the rows it owns from
   `snapshot_url` (a model's ``sparse/`` directory, written by any world size), or leave it empty
   when there is no published model.  The snapshot is read once for all the ranks that need it,
   one row group at a time; rows of another format (a model trained with another sparse optimizer
   or row dtype, e.g. one written before compact rows) are converted (`RowFormat.convert`) and the
   report says so (`converted_from`);
3. drop the vocabulary's evicted keys (and compact when a quarter of the file is holes);
4. tag the shard with `snapshot_tag`;
5. write the rank's working set (the day's keys it owns, hottest first, cut to what fits the host
   budget) to ``<shard>/working_set.npy``, which the rank loads into host memory (`load_working_set`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from storage.embedding.base import EmbeddingStore, owner_of
from storage.embedding.config import StoreConfig
from storage.embedding.host import rows_for_budget
from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import iter_snapshot, snapshot_format
from storage.embedding.ssd.store import SsdStore
from storage.embedding.ssd.upgrade import convert_shard, cost
from storage.io import fsio
from storage.io.layout import NodeLayout

log = logging.getLogger(__name__)

WORKING_SET = "working_set.npy"
"""File name of a rank's working set inside its shard directory."""
TOKEN = "warm_token"  # noqa: S105 - a file name, no secret
"""File inside a shard directory naming the warm it holds (`WarmPlan.token`)."""
COMPACT_FRACTION = 0.25
"""Compact a shard when at least this fraction of its slots are holes."""


@dataclass(frozen=True, kw_only=True)
class WarmPlan:
    """What warming the shards of a `world_size`-rank job for one day needs."""

    date: str
    world_size: int
    sparse_optimizer: str
    """The day's `optim.sparse_optimizer`: with `store.row_dtype`, the format the shards must hold."""
    published_version: str | None
    """The registry version whose rows the shards must hold (None: no published model, start empty)."""
    snapshot_url: str | None
    """That version's ``sparse/`` directory (None: start empty)."""
    snapshot_tag: str | None
    """That version's run tag: a shard already tagged with it is kept as it is."""
    evict_url: str | None
    """The day's vocabulary's ``evicted.parquet`` (keys to drop)."""
    working_set_url: str | None
    """The day's features' ``key_counts.parquet`` (keys, hottest first)."""

    @property
    def token(self) -> str:
        """Names this warm: the day's working set over the published state, for one world size."""
        return f"{self.date}|{self.published_version or 'none'}|{self.world_size}"

    def cold(self) -> WarmPlan:
        """The same plan starting from empty shards (the published rows do not fit this run)."""
        return WarmPlan(
            date=self.date,
            world_size=self.world_size,
            sparse_optimizer=self.sparse_optimizer,
            published_version=None,
            snapshot_url=None,
            snapshot_tag=None,
            evict_url=self.evict_url,
            working_set_url=self.working_set_url,
        )


def is_warm(shard_dir: str | Path, token: str) -> bool:
    path = Path(shard_dir) / TOKEN
    return path.exists() and path.read_text() == token


def mark_warm(shard_dir: str | Path, token: str) -> None:
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(shard_dir) / f"{TOKEN}.tmp"
    tmp.write_text(token)
    tmp.replace(Path(shard_dir) / TOKEN)


def read_keys(url: str | None, storage_options: dict[str, Any] | None = None) -> np.ndarray:
    """The `key` column of a Parquet file (empty when `url` is None or absent)."""
    import pyarrow.parquet as pq

    if not url:
        return np.empty(0, dtype=np.int64)
    fs, path = fsio.get_fs(url, storage_options)
    if not fs.exists(path):
        return np.empty(0, dtype=np.int64)
    with fs.open(path, "rb") as f:
        keys: np.ndarray = pq.read_table(f, columns=["key"]).column("key").to_numpy().astype(np.int64, copy=False)
        return keys


def _open(
    rank: int, shard: str, store: StoreConfig, fmt: RowFormat, tag: str | None
) -> tuple[SsdStore, dict[str, Any]]:
    """Rank `rank`'s shard as a store of `fmt`, and the start of its report (with `converted`, when it held records
    of another format: `{"from", "rows", "s"}`).

    A shard of another row format or record layout that holds the rows tagged `tag` (the published model's) is
    converted where it lies (`storage.embedding.ssd.upgrade`); any other (another dim, not closed cleanly, other
    rows) is a cache of a snapshot: it starts over, and `_restore_stale` restores it."""
    report: dict[str, Any] = {"rank": rank, "shard_dir": shard, "restored": False, "seconds": 0.0}
    try:
        return SsdStore(shard, fmt, init_std=store.init_std), report
    except ValueError as exc:
        t0 = time.perf_counter()
        converted = convert_shard(Path(shard), fmt, init_std=store.init_std, tag=tag)
        if converted is not None:
            log.info("%s", converted.summary(shard))
            report["converted"] = {"from": converted.source, "rows": converted.rows, "s": converted.seconds}
            report["seconds"] = time.perf_counter() - t0
        else:
            log.warning("discarding shard %s (restored from the published snapshot): %s", shard, exc)
            shutil.rmtree(shard)
        return SsdStore(shard, fmt, init_std=store.init_std), report


def _ordered_unique(keys: np.ndarray) -> np.ndarray:
    """Distinct keys in order of first appearance."""
    _, first = np.unique(keys, return_index=True)
    return keys[np.sort(first)]


def _save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:12]}")
    with open(tmp, "wb") as f:
        np.save(f, arr)
    os.replace(tmp, path)


def _restore_many(
    shards: dict[int, SsdStore], url: str, world: int, storage_options: dict[str, Any] | None
) -> RowFormat | None:
    """Wipe `shards` (rank -> store) and fill each with the rows of `url` it owns, in one pass over `url`,
    converted to the shards' format; returns the snapshot's format (None for an empty directory)."""
    src = snapshot_format(url, storage_options)
    dims = {s.dim for s in shards.values()}
    if src is not None and dims != {src.dim}:
        raise ValueError(
            f"snapshot {url} has dim {src.dim}, the shards have dim {sorted(dims)}; fix store.embedding_dim"
        )
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
            shards[rank].write_rows(uniq, b.select(sel).rows_as(shards[rank].row_format))
    return src


def _restore_stale(
    shards: dict[int, SsdStore],
    reports: dict[int, dict[str, Any]],
    fmt: RowFormat,
    snapshot_url: str | None,
    snapshot_tag: str | None,
    *,
    world: int,
    storage_options: dict[str, Any] | None,
) -> str | None:
    """Step 2 of `warm_shards`: the shards not tagged `snapshot_tag` get the rows they own of `snapshot_url`
    (emptied when it is None); each report gets `restored` and its share of the time.  Returns the snapshot's
    format name when its rows were converted to `fmt`, else None."""
    stale = {r: s for r, s in shards.items() if snapshot_tag is None or s.tag != snapshot_tag}
    if not stale:
        return None
    converted_from: str | None = None
    t0 = time.perf_counter()
    if snapshot_url is not None:
        src = _restore_many(stale, snapshot_url, world, storage_options)
        if src is not None and src != fmt:
            converted_from = src.name
            log.info("converted the rows of %s from %s to %s", snapshot_url, src.name, fmt.name)
        for r in stale:
            reports[r]["restored"] = True
    else:
        for s in stale.values():
            s.wipe()
    took = time.perf_counter() - t0
    if snapshot_url is not None and (rows := sum(len(s) for s in stale.values())):
        log.info("restored %d shard(s) from %s: %s", len(stale), snapshot_url, cost(rows, took))
    for r in stale:
        reports[r]["seconds"] += took / len(stale)
        if snapshot_url is not None:
            reports[r]["restored_rows"], reports[r]["restore_s"] = len(stale[r]), took / len(stale)
    return converted_from


def _finish_shard(
    s: SsdStore,
    report: dict[str, Any],
    world: int,
    evict_keys: np.ndarray,
    working_set: np.ndarray,
    *,
    capacity: int,
    snapshot_tag: str | None,
) -> None:
    """Steps 3-5 of `warm_shards` for the shard of `report["rank"]`, then close it: drop the evicted keys
    it owns (compacting a file a quarter holes), tag it, write the working set it owns cut to `capacity`
    rows.  Adds rows, evicted, working_set_keys, working_set_fits and the time taken to `report`."""
    t0 = time.perf_counter()
    rank = report["rank"]
    ek = evict_keys[owner_of(evict_keys, world) == rank]
    evicted = int(s.contains(ek).sum()) if ek.size else 0
    if evicted:
        s.evict(torch.from_numpy(ek))
        st = s.stats()["ssd"]
        if st["free_slots"] >= COMPACT_FRACTION * max(1, st["slots"]):
            s.compact()
    s.set_tag(snapshot_tag)
    ws = _ordered_unique(working_set[owner_of(working_set, world) == rank])
    keep = ws[:capacity]
    _save_npy_atomic(Path(report["shard_dir"]) / WORKING_SET, keep)
    report.update(
        rows=len(s),
        evicted=evicted,
        working_set_keys=int(keep.size),
        working_set_fits=float(min(1.0, capacity / ws.size)) if ws.size else 1.0,
    )
    s.close()
    report["seconds"] = round(report["seconds"] + time.perf_counter() - t0, 4)


def warm_shards(
    *,
    node: NodeLayout,
    world_size: int,
    ranks: list[int],
    store: StoreConfig,
    optimizer: str,
    snapshot_url: str | None,
    snapshot_tag: str | None,
    evict_keys: np.ndarray,
    working_set: np.ndarray,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Prepare the SSD shards of `ranks` for a training run (see the module docstring).

    Args:
        node: this node's folder of the model's shards.
        world_size: ranks in the training job (the owner of key k is `k % world_size`).
        ranks: the ranks whose shards live on this node.
        store: the store configuration (dim, row dtype, init std, host budget).
        optimizer: the day's sparse optimizer (`optim.sparse_optimizer`); with `store`, the rows' format.
        snapshot_url: the published model's ``sparse/`` directory (or one file), or None.
        snapshot_tag: the published model's tag; a shard already tagged with it is kept.
        evict_keys: keys the vocabulary dropped (int64, any owner).
        working_set: the day's keys, hottest first (int64, any owner).
        storage_options: fsspec options for `snapshot_url`.

    Returns:
        ``{"world_size", "snapshot_url", "snapshot_tag", "row_format", "converted_from", "seconds", "rows",
        "ranks": [per rank:
        {"rank", "shard_dir", "rows", "restored", "evicted", "working_set_keys", "working_set_fits", "seconds"},
        with "restored_rows" and "restore_s" for a shard restored from the snapshot, and "converted" ({"from": the
        records' former format, "rows", "s"}) for one converted where it lies]}`` where `working_set_fits` is the
        fraction of the rank's working set that fits the host budget (the file holds that part); `converted_from`
        names the rows' former format (`optimizer/row_dtype`) when the snapshot's or a shard's rows were converted,
        else None.

    Raises:
        ValueError: bad ranks / world size, or a snapshot of another dim.
        FileNotFoundError: `snapshot_url` does not exist.
    """
    t_start = time.perf_counter()
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks must be distinct, got {ranks}")
    shard_dirs = {r: node.shard(r, world_size) for r in ranks}  # validates
    evict_keys = np.ascontiguousarray(evict_keys, dtype=np.int64).reshape(-1)
    working_set = np.ascontiguousarray(working_set, dtype=np.int64).reshape(-1)
    fmt = store.row_format(optimizer)
    capacity = rows_for_budget(store.host_budget_mb << 20, fmt)

    shards: dict[int, SsdStore] = {}
    reports: dict[int, dict[str, Any]] = {}
    try:
        for r in ranks:
            shards[r], reports[r] = _open(r, shard_dirs[r], store, fmt, snapshot_tag)
        converted_from = _restore_stale(
            shards, reports, fmt, snapshot_url, snapshot_tag, world=world_size, storage_options=storage_options
        )
        for r in ranks:
            _finish_shard(
                shards[r], reports[r], world_size, evict_keys, working_set, capacity=capacity, snapshot_tag=snapshot_tag
            )
    finally:
        for s in shards.values():
            s.close()
    out = [reports[r] for r in ranks]
    log.info("warmed %d shards of %s (restored %d)", len(out), node.model_name, sum(x["restored"] for x in out))
    rows_from = next((x["converted"]["from"].split()[-1] for x in out if "converted" in x), None)
    return {
        "world_size": world_size,
        "snapshot_url": snapshot_url,
        "snapshot_tag": snapshot_tag,
        "row_format": fmt.name,
        "converted_from": converted_from or rows_from,
        "rows": sum(x["rows"] for x in out),
        "seconds": round(time.perf_counter() - t_start, 4),
        "ranks": out,
    }


def warm_plan_shards(
    plan: WarmPlan,
    node: NodeLayout,
    ranks: list[int],
    store: StoreConfig,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`warm_shards` for `plan` on `ranks` of this node, then mark each shard warm for the plan."""
    report = warm_shards(
        node=node,
        world_size=plan.world_size,
        ranks=ranks,
        store=store,
        optimizer=plan.sparse_optimizer,
        snapshot_url=plan.snapshot_url,
        snapshot_tag=plan.snapshot_tag,
        evict_keys=read_keys(plan.evict_url, storage_options),
        working_set=read_keys(plan.working_set_url, storage_options),
        storage_options=storage_options,
    )
    for rank in ranks:
        mark_warm(node.shard(rank, plan.world_size), plan.token)
    return report


def ensure_warm(
    plan: WarmPlan | None,
    node: NodeLayout,
    *,
    rank: int,
    store: StoreConfig,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Warm this rank's shard unless its token says it already holds `plan` (None: nothing to do).

    The flow's warm stage warms the shards of the node it runs on; on any other node of a
    multi-node job the rank (or `ctrpipe warm-node` before torchrun) does it here.
    """
    if plan is None or is_warm(node.shard(rank, plan.world_size), plan.token):
        return None
    report = warm_plan_shards(plan, node, [rank], store, storage_options)
    log.info("rank %d warmed its own shard: %d rows", rank, report["rows"])
    return report


def load_working_set(store: EmbeddingStore, shard_dir: str) -> int:
    """Load the working set `warm_shards` left in `shard_dir` into the store's fast levels; returns its keys."""
    path = os.path.join(shard_dir, WORKING_SET)
    if not os.path.exists(path):
        return 0
    keys = torch.from_numpy(np.load(path).astype(np.int64, copy=False))
    store.warm(keys)
    return int(keys.numel())


def group_rank(my_addr: str, all_addrs: list[str]) -> int:
    """A node's rank under c10d rendezvous: its position among the sorted, distinct addresses.

    torchrun's c10d rendezvous ignores `--node_rank` and numbers nodes in the sorted order of their
    `--local_addr` strings, so the job scripts pass each node's address to both.
    """
    addrs = [a for a in (x.strip() for x in all_addrs) if a]
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"node addresses must be distinct (c10d orders nodes by address), got {addrs}")
    if my_addr not in addrs:
        raise ValueError(f"this node's address {my_addr!r} is not among the job's addresses {addrs}")
    return sorted(addrs).index(my_addr)


def node_ranks(node: int, nproc_per_node: int) -> list[int]:
    """Global ranks torchrun gives the processes of group rank `node` (contiguous per node)."""
    return list(range(node * nproc_per_node, (node + 1) * nproc_per_node))
