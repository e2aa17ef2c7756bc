"""The Dask client the data stages run on: a LocalCluster or an existing scheduler."""

from __future__ import annotations

import logging
import os
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import dask
from distributed import Client, Future, LocalCluster, WorkerPlugin, wait
from distributed.core import Status

from pipeline.config import DaskConfig

MAX_LOCAL_WORKERS = 4
PRE_SPAWN_ENVIRON = "distributed.nanny.pre-spawn-environ"
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": str(64 << 20), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
"""glibc settings of LocalCluster worker processes (see `worker_environ`)."""
STALL_KEY = "ctrpipe.stall-timeout-s"
"""Dask config key `dask_client` sets from `dask.stall_timeout_s` for `finished` and `gather` to read."""
SLOW_SCRATCH = "Creating scratch directories is taking a surprisingly long time"
"""How distributed's warning starts when making a worker's scratch folder took over 1 s (see `dask_client`)."""
COMPUTE_FAILED = "Compute Failed"
"""How distributed's worker log line about a task's exception starts (the client raises that exception)."""


class StageStalled(TimeoutError):
    """No task of a stage finished within `dask.stall_timeout_s`: the run fails instead of waiting forever."""


def finished(client: Client, futures: Sequence[Future], *, what: str) -> Iterator[Future]:
    """Yield `futures` as they finish (done or failed), in any order.

    Raises:
        StageStalled: none finished for `dask.stall_timeout_s` seconds (`STALL_KEY`); the futures are
            cancelled and the message gives the workers' states (a worker paused for memory runs no task).
    """
    stall = float(dask.config.get(STALL_KEY, default=DaskConfig().stall_timeout_s))
    pending = list(futures)
    while pending:
        try:
            done, rest = wait(pending, timeout=stall, return_when="FIRST_COMPLETED")
        except TimeoutError:
            client.cancel(pending)
            states = _worker_states(client)
            paused = (
                " A paused worker is over 80% of dask.memory_limit: raise it, or run fewer threads per worker."
                if "paused" in states
                else ""
            )
            raise StageStalled(
                f"{what}: no Dask task finished in {stall:g} s, {len(pending)} of {len(futures)} still pending; "
                f"workers: {states}.{paused} Set dask.stall_timeout_s to wait longer for slow tasks"
            ) from None
        yield from done
        pending = list(rest)


def gather(client: Client, futures: Sequence[Future], *, what: str) -> list[Any]:
    """The futures' results in their order, like `client.gather`, but failing with `StageStalled` instead of
    waiting forever (`finished`); the first failed task's exception is raised."""
    for future in finished(client, futures, what=what):
        if future.status == "error":
            try:
                future.result()  # raises the task's exception with its remote traceback
            finally:
                client.cancel([f for f in futures if f is not future])
    return client.gather(list(futures))


def _worker_states(client: Client) -> str:
    try:
        workers = client.scheduler_info().get("workers", {})
    except Exception as exc:  # the scheduler itself is gone: say so
        return f"unknown ({type(exc).__name__}: {exc})"
    counts = Counter(str(w.get("status", "unknown")) for w in workers.values())
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"


def local_worker_count(config: DaskConfig) -> int:
    """`config.n_workers`, or one per core capped at MAX_LOCAL_WORKERS when it is 0."""
    return config.n_workers or max(1, min(os.cpu_count() or 1, MAX_LOCAL_WORKERS))


def local_memory_limit(config: DaskConfig) -> str | int:
    """The per-worker memory limit a LocalCluster is started with: `config.memory_limit`, or 0 (none)
    for a cluster of threads.

    Dask measures a worker's memory as its process's resident size.  A worker thread shares its
    process with this run (Prefect, the trainer of earlier days, a test session): once that process
    passes 80% of the limit, Dask pauses the worker, the only one of a one-worker cluster, and the
    stage waits forever on tasks nobody runs.  Worker processes measure only themselves, so there
    the limit holds (and a nanny restarts a worker past 95%).
    """
    return config.memory_limit if config.processes else 0


def worker_environ() -> dict[str, str]:
    """Dask's pre-spawn environment of worker processes with `WORKER_MALLOC` applied.

    Dask sets MALLOC_TRIM_THRESHOLD_=65536 so that idle workers hand memory back.  Setting it
    also fixes glibc's mmap threshold at 128 KiB: every NumPy or Parquet buffer above that is a
    fresh mmap, returned on free and page-faulted in again by the next task.  With the mmap
    threshold above a task's arrays and a trim threshold above its working set, buffers are
    reused from the heap, at the cost of at most the trim threshold more resident memory per
    idle worker.
    """
    env = {k: str(v) for k, v in (dask.config.get(PRE_SPAWN_ENVIRON, default=None) or {}).items()}
    inherited = env.get("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", ""))
    quiet = f"ignore:{SLOW_SCRATCH}:UserWarning"
    env["PYTHONWARNINGS"] = f"{inherited},{quiet}" if inherited else quiet
    return {**env, **WORKER_MALLOC}


class QuietWorkers(WorkerPlugin):
    """Drops two kinds of ERROR lines the worker processes of our LocalCluster print to the terminal.

    - Connection errors while the worker closes: a heartbeat in flight when the scheduler goes away
      fails with CommClosedError and is logged with a traceback (a race inside distributed), although
      the cluster is being shut down on purpose.  Connection errors of a running worker are kept.
    - "Compute Failed" reports: the task's exception reaches the stage, which raises it (with the
      remote traceback), so the worker's copy only repeats it.
    """

    name = "ctrpipe-quiet-workers"

    def setup(self, worker: Any) -> None:
        closing = {Status.closing, Status.closed, Status.closing_gracefully, Status.failed}

        def keep(record: logging.LogRecord) -> bool:
            exc = record.exc_info[1] if record.exc_info else None
            if str(record.msg).startswith(COMPUTE_FAILED):
                return False
            return not (worker.status in closing and isinstance(exc, OSError))

        for name in ("distributed.worker", "distributed.core"):
            logging.getLogger(name).addFilter(keep)


@contextmanager
def dask_client(config: DaskConfig) -> Iterator[Client]:
    """Yield a client; start (and afterwards close) a LocalCluster when `config.address` is empty.

    Connecting to `config.address` leaves that cluster running: it is not ours to stop (nor to
    configure: the malloc thresholds apply only to the workers of a LocalCluster started here).
    A LocalCluster's scratch folders are under TMPDIR on this machine; distributed's warning that
    making them took over a second (a busy local disk, not the network file system it suggests)
    is a 300-character line in the middle of the day's report, so it is dropped, in this process
    and in the worker processes (`worker_environ`).
    """
    if config.address:
        try:
            client = Client(config.address)
        except OSError as exc:  # the scheduler is down or unreachable (Dask's own message names no key)
            raise OSError(
                f"cannot reach the Dask scheduler at dask.address={config.address!r} ({exc}); start it, or set "
                "dask.address to empty to run a local cluster"
            ) from exc
        with client, dask.config.set({STALL_KEY: config.stall_timeout_s}):
            yield client
        return
    warnings.filterwarnings("ignore", message=SLOW_SCRATCH, category=UserWarning)
    env = worker_environ()
    # The nanny copies its pre-spawn environment into this process's os.environ before it spawns
    # a worker; put back what was here so that processes this one starts later (torchrun) do not
    # inherit the workers' malloc settings.
    saved = {name: os.environ.get(name) for name in env}
    try:
        # The nanny lets a variable already set here win over its pre-spawn value; this one extends it.
        os.environ["PYTHONWARNINGS"] = env["PYTHONWARNINGS"]
        with dask.config.set({PRE_SPAWN_ENVIRON: env}):
            cluster = LocalCluster(
                n_workers=local_worker_count(config),
                threads_per_worker=config.threads_per_worker,
                processes=config.processes,
                memory_limit=local_memory_limit(config),
                dashboard_address=":0",  # any free port: never clash with another run on the machine
            )
    finally:
        _restore_environ(saved)
    try:
        with Client(cluster) as client, dask.config.set({STALL_KEY: config.stall_timeout_s}):
            if config.processes:
                client.register_plugin(QuietWorkers())
            yield client
    finally:
        cluster.close()
        _restore_environ(saved)


def _restore_environ(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
