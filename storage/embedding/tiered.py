"""Building the tier stack of one rank's shard: device cache / host memory / SSD.

    DeviceCache(capacity=store.device_cache_rows, policy=store.cache_policy, device)   optional
      -> HostStore(budget=store.host_budget_mb MiB, LFU)
        -> SsdStore(<local_dir>/<model_name>/shard-RRRRR-of-WWWWW/)

The returned object is the top tier, itself an `EmbeddingStore`: `stats()`
reports every tier (top first), `flush()` writes dirty rows all the way down and
persists the SSD index, `snapshot()` flushes then snapshots the SSD level (which
then holds every row exactly once, with its latest values), `close()` flushes
and closes every tier.  `set_tag` / `tag` reach the SSD shard.
"""

from __future__ import annotations

import torch

from storage.embedding.base import EmbeddingStore
from storage.embedding.config import StoreConfig
from storage.embedding.device_cache import DeviceCache
from storage.embedding.host import HostStore
from storage.embedding.ssd.store import SsdStore


def open_shard(
    shard_dir: str, config: StoreConfig, *, optimizer: str, device: torch.device | str = "cpu"
) -> EmbeddingStore:
    """Open the tier stack of one shard (creating the SSD directory when needed).

    Args:
        shard_dir: the shard's directory (`storage.io.layout.NodeLayout.shard`).
        config: dim, row dtype, init std, host budget, device-cache rows and policy.
        optimizer: the sparse optimizer (`optim.sparse_optimizer`): the rows keep its state.
        device: the training device; the device cache (when `config.device_cache_rows > 0`) lives there.

    Returns:
        The top tier: a `DeviceCache` over a `HostStore`, or the `HostStore` when the device cache is off.
    """
    fmt = config.row_format(optimizer)
    ssd = SsdStore(shard_dir, fmt, init_std=config.init_std)
    try:
        host = HostStore(fmt, budget_bytes=config.host_budget_mb << 20, below=ssd, init_std=config.init_std)
        if config.device_cache_rows > 0:
            return DeviceCache(host, capacity_rows=config.device_cache_rows, policy=config.cache_policy, device=device)
        return host
    except BaseException:
        ssd.close()
        raise
