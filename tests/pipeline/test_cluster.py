"""The LocalCluster the data stages run on: worker malloc settings, and none for an external scheduler."""

from __future__ import annotations

import os

import dask

from pipeline.cluster import PRE_SPAWN_ENVIRON, dask_client, worker_environ
from pipeline.config import DaskConfig


def test_local_workers_get_malloc_thresholds_on_top_of_dasks_environment():
    with dask.config.set(
        {PRE_SPAWN_ENVIRON: {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1}}
    ):
        env = worker_environ()
        assert env == {"MALLOC_TRIM_THRESHOLD_": str(64 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
                       "OMP_NUM_THREADS": "1"}  # fmt: skip


def malloc_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


def test_a_local_cluster_spawns_its_workers_with_them_and_leaves_this_process_alone():
    before = malloc_environ()
    with dask_client(DaskConfig(n_workers=1, memory_limit="1GiB")) as client:
        seen = client.run(malloc_environ)
        assert malloc_environ() == before
    want = {
        "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
        "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    }
    assert list(seen.values()) == [want]
    assert malloc_environ() == before
