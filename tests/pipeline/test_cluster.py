"""The LocalCluster the data stages run on: worker malloc settings (none for an external scheduler), a
scheduler address that names its key when unreachable, and a quiet shutdown."""

from __future__ import annotations

import logging
import os
import time
import warnings
from types import SimpleNamespace

import dask
import numpy as np
import pytest
from distributed import Client, Event, LocalCluster, wait
from distributed.comm.core import CommClosedError
from distributed.core import Status

from pipeline.cluster import (
    PRE_SPAWN_ENVIRON,
    SLOW_SCRATCH,
    STALL_KEY,
    QuietWorkers,
    StageStalled,
    dask_client,
    gather,
    worker_environ,
)
from pipeline.config import DaskConfig


def test_local_workers_get_malloc_thresholds_on_top_of_dasks_environment():
    with dask.config.set({PRE_SPAWN_ENVIRON: {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1}}):
        env = worker_environ()
        assert env == {
            "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
            "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
            "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": f"ignore:{SLOW_SCRATCH}:UserWarning",
        }


def _slow_scratch_warnings() -> int:
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn(f"{SLOW_SCRATCH}. (1.73s) This is often due to ...", UserWarning, stacklevel=1)
    return len(seen)


@pytest.mark.server  # a LocalCluster of worker processes and its scheduler
def test_the_slow_scratch_folder_warning_never_reaches_the_days_report(monkeypatch):
    # Seen once in the demo on a loaded CI machine: a 305-character line among the stage lines.
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    with dask_client(DaskConfig(n_workers=1, memory_limit="1GiB")) as client:
        assert list(client.run(_slow_scratch_warnings).values()) == [0]
        assert _slow_scratch_warnings() == 0
        assert list(client.run(lambda: os.environ["PYTHONWARNINGS"]).values()) == [
            f"default::DeprecationWarning,ignore:{SLOW_SCRATCH}:UserWarning"
        ]


def malloc_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}


@pytest.mark.server  # a LocalCluster of worker processes and its scheduler
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


def test_a_cluster_of_threads_keeps_running_tasks_when_this_process_is_past_the_memory_limit():
    # A thread worker is measured by the whole process: with the limit applied it pauses and a
    # gather waits forever (the probable cause of a vocab-stage hang seen once in a full test session).
    held = np.ones((256 << 20) // 8)  # this process alone is now far past 64 MiB
    with dask_client(DaskConfig(n_workers=1, processes=False, memory_limit="64MiB")) as client:
        time.sleep(1.0)  # ten of Dask's memory checks (monitor-interval 100ms) before the first task
        futures = client.map(lambda x: x + 1, range(4), pure=False)
        wait(futures, timeout=30)  # raises TimeoutError where the worker paused
        assert client.gather(futures) == [1, 2, 3, 4]
    assert held[0] == 1.0


def _wait_for(name: str) -> int:
    Event(name).wait()
    return 1


def test_a_stage_whose_tasks_stop_finishing_fails_saying_so_instead_of_waiting_forever():
    with dask_client(DaskConfig(n_workers=1, processes=False, stall_timeout_s=1.5)) as client:
        assert dask.config.get(STALL_KEY) == 1.5
        assert gather(client, client.map(lambda x: x * 2, range(5), pure=False), what="t") == [0, 2, 4, 6, 8]
        futures = [
            client.submit(_wait_for, "never-set", pure=False),
            client.submit(lambda: 3, pure=False),
        ]  # one thread
        with pytest.raises(
            StageStalled,
            match=r"vocab D: no Dask task finished in 1.5 s, 2 of 2 still pending; "
            r"workers: 1 running\. Set dask.stall_timeout_s",
        ):
            gather(client, futures, what="vocab D")
        Event("never-set", client=client).set()


def test_a_worker_paused_for_memory_is_named_in_the_stall():
    # memory_limit applied to a thread worker (what dask_client no longer does): it pauses at once
    held = np.ones((256 << 20) // 8)
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, memory_limit="64MiB", dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
        dask.config.set({STALL_KEY: 2.0}),
    ):
        time.sleep(1.0)
        with pytest.raises(
            StageStalled, match=r"workers: 1 paused\. A paused worker is over 80% of dask.memory_limit: raise it"
        ):
            gather(client, client.map(lambda x: x, range(3), pure=False), what="encode D")
    assert held[0] == 1.0


def test_a_failed_task_raises_its_own_error():
    def boom(x: int) -> int:
        if x == 2:
            raise ValueError("part 2 is bad")
        return x

    with dask_client(DaskConfig(n_workers=1, processes=False)) as client, pytest.raises(ValueError, match="part 2"):
        gather(client, client.map(boom, range(4), pure=False), what="t")


def test_an_unreachable_scheduler_is_named_by_its_key(free_port):
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "1s"}),
        pytest.raises(
            OSError, match=rf"cannot reach the Dask scheduler at dask.address='tcp://127.0.0.1:{free_port}'.*empty"
        ),
        dask_client(DaskConfig(address=f"tcp://127.0.0.1:{free_port}")),
    ):
        pass


def test_workers_drop_connection_errors_while_closing_and_compute_failed_reports():
    worker = SimpleNamespace(status=Status.running)
    logger = logging.getLogger("distributed.worker")
    before = list(logger.filters)
    QuietWorkers().setup(worker)
    try:

        def record(exc: BaseException | None) -> logging.LogRecord:
            info = (type(exc), exc, None) if exc else None
            return logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "heartbeat failed", (), info)

        assert logger.filter(record(CommClosedError("closed")))  # a running worker: a real problem
        worker.status = Status.closing
        assert not logger.filter(record(CommClosedError("closed")))
        assert logger.filter(record(ValueError("bug"))) and logger.filter(record(None))
        failed = logger.makeRecord(logger.name, logging.ERROR, __file__, 1, "Compute Failed\nKey: x", (), None)
        assert not logger.filter(failed)  # the stage raises the task's exception itself
    finally:
        logger.filters[:] = before
