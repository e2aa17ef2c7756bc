"""The Dask client the data stages run on: a LocalCluster or an existing scheduler."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client, LocalCluster

from pipeline.config import DaskConfig

MAX_LOCAL_WORKERS = 4


def local_worker_count(config: DaskConfig) -> int:
    """`config.n_workers`, or one per core capped at MAX_LOCAL_WORKERS when it is 0."""
    return config.n_workers or max(1, min(os.cpu_count() or 1, MAX_LOCAL_WORKERS))


@contextmanager
def dask_client(config: DaskConfig) -> Iterator[Client]:
    """Yield a client; start (and afterwards close) a LocalCluster when `config.address` is empty.

    Connecting to `config.address` leaves that cluster running: it is not ours to stop.
    """
    if config.address:
        with Client(config.address) as client:
            yield client
        return
    cluster = LocalCluster(
        n_workers=local_worker_count(config),
        threads_per_worker=config.threads_per_worker,
        processes=config.processes,
        memory_limit=config.memory_limit,
        dashboard_address=":0",  # any free port: never clash with another run on the machine
    )
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()
