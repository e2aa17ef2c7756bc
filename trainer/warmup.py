"""Rank-side warm: each rank brings its own SSD shard to the published state before training.

The flow's warm stage warms the shards of the node it runs on.  On several
nodes that is not enough: torchrun's c10d rendezvous numbers nodes by itself,
so only a rank knows which shard is its own.  Every rank therefore checks a
token in its shard directory; when the flow already warmed the shard for this
run the token matches and nothing happens, otherwise the rank warms it here
with the same function the flow uses (`storage.warm.warm_shards`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from storage import fsio

log = logging.getLogger(__name__)

TOKEN = "warm_token"


def warm_token(date: str, published_version: str | None, world_size: int) -> str:
    """Identifies one warm: the day's working set over the published state, for one world size."""
    return f"{date}|{published_version or 'none'}|{world_size}"


def is_warm(shard_dir: str | Path, token: str) -> bool:
    path = Path(shard_dir) / TOKEN
    return path.exists() and path.read_text() == token


def mark_warm(shard_dir: str | Path, token: str) -> None:
    Path(shard_dir).mkdir(parents=True, exist_ok=True)
    tmp = Path(shard_dir) / f"{TOKEN}.tmp"
    tmp.write_text(token)
    tmp.replace(Path(shard_dir) / TOKEN)


def read_keys(url: str | None, storage_options: dict | None = None) -> np.ndarray:
    """The `key` column of a Parquet file (empty when `url` is None or absent)."""
    import pyarrow.parquet as pq

    if not url:
        return np.empty(0, dtype=np.int64)
    fs, path = fsio.get_fs(url, storage_options)
    if not fs.exists(path):
        return np.empty(0, dtype=np.int64)
    with fs.open(path, "rb") as f:
        return pq.read_table(f, columns=["key"]).column("key").to_numpy().astype(np.int64, copy=False)


def ensure_warm(
    warm: dict[str, Any] | None,
    *,
    local_dir: str,
    model_name: str,
    rank: int,
    world_size: int,
    store: Any,
    storage_options: dict | None = None,
) -> dict[str, Any] | None:
    """Warm this rank's shard unless its token says it is already warm for `warm["token"]`.

    `warm` holds snapshot_url, snapshot_tag, evict_url, working_set_url and token
    (see `flows.stages.train_stage`); None means the caller warmed everything.
    """
    from storage.tiered import shard_dir_for
    from storage.warm import warm_shards

    if not warm:
        return None
    shard_dir = shard_dir_for(local_dir, model_name, rank, world_size)
    if is_warm(shard_dir, warm["token"]):
        return None
    report = warm_shards(
        local_dir=local_dir,
        model_name=model_name,
        world_size=world_size,
        ranks=[rank],
        store=store,
        snapshot_url=warm.get("snapshot_url"),
        snapshot_tag=warm.get("snapshot_tag"),
        evict_keys=read_keys(warm.get("evict_url"), storage_options),
        working_set=read_keys(warm.get("working_set_url"), storage_options),
        storage_options=storage_options,
    )
    mark_warm(shard_dir, warm["token"])
    log.info("rank %d warmed its own shard: %s", rank, report)
    return report
