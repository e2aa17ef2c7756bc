"""Building the tier stack of one rank's shard: device cache / host memory / SSD.

    DeviceCache(capacity=device_cache_rows(store, ...), policy=store.cache_policy, device)   on CUDA by default
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
from storage.embedding.host import HostStore, rows_for_budget
from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.store import SsdStore

AUTO_DEVICE_SHARE = 0.25
"""The share of the GPU memory free when a shard opens that `store.device_cache_rows: auto` may take (the model,
its activations and NCCL's buffers are small beside it; ranks sharing a GPU each take a share of what is left)."""


def auto_device_cache_rows(config: StoreConfig, fmt: RowFormat, free_bytes: int) -> int:
    """`auto`'s rows on a GPU with `free_bytes` free: as many as the host tier holds (`store.host_budget_mb`), so
    that the device tier evicts only when the host tier spills to SSD too, within `AUTO_DEVICE_SHARE` of the free
    memory."""
    return max(
        0,
        min(rows_for_budget(config.host_budget_mb << 20, fmt), int(free_bytes * AUTO_DEVICE_SHARE) // fmt.row_bytes()),
    )


def device_cache_rows(config: StoreConfig, fmt: RowFormat, device: torch.device | str) -> int:
    """The device tier's rows for a shard on `device`: `store.device_cache_rows`, or for `auto` the HBM tier of the
    HBM / host / SSD hierarchy on CUDA (`auto_device_cache_rows` of the memory free now) and none elsewhere.

    On CUDA the device tier keeps a step's row gradients on the GPU; without it every push copies them to the
    host store and waits for that copy (`trainer.distributed.sharded_embedding.ShardedEmbedding._to_store`).
    """
    rows = config.device_cache_rows
    if rows != "auto":
        return int(rows)
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return auto_device_cache_rows(config, fmt, torch.cuda.mem_get_info(device)[0])


def open_shard(
    shard_dir: str, config: StoreConfig, *, optimizer: str, device: torch.device | str = "cpu", seed: int = 0
) -> EmbeddingStore:
    """Open the tier stack of one shard (creating the SSD directory when needed).

    Args:
        shard_dir: the shard's directory (`storage.io.layout.NodeLayout.shard`).
        config: dim, row dtype, init std, host budget, device-cache rows and policy.
        optimizer: the sparse optimizer (`optim.sparse_optimizer`): the rows keep its state.
        device: the training device; the device tier (`device_cache_rows`: by default on CUDA) lives there.
        seed: `optim.seed`: every tier's updates round with the noise it seeds (`RowFormat.seed`).

    Returns:
        The top tier: a `DeviceCache` over a `HostStore`, or the `HostStore` when the device cache is off.
    """
    fmt = config.row_format(optimizer, seed)
    ssd = SsdStore(shard_dir, fmt, init_std=config.init_std, write_behind=True)  # evictions written off the step
    try:
        host = HostStore(fmt, budget_bytes=config.host_budget_mb << 20, below=ssd, init_std=config.init_std)
        rows = device_cache_rows(config, fmt, device)
        if rows > 0:
            return DeviceCache(host, capacity_rows=rows, policy=config.cache_policy, device=device)
        return host
    except BaseException:
        ssd.close()
        raise
