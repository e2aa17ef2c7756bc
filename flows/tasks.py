"""Prefect tasks: thin wrappers that call the stage functions and log what they did.

Retries only where a retry can succeed: transient I/O (a flaky object store,
a lost Dask worker, a torchrun rendezvous hiccup).  Deterministic data errors
(bad input over the quarantine threshold, a missing day, a config error) fail
at once.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows import stages
from flows.config import RunConfig


def _transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Retry condition: only I/O-level failures that a second attempt can fix."""
    try:
        state.result()
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError):
        return False
    except (OSError, TimeoutError, ConnectionError):
        return True
    except Exception:
        return False
    return False


_IO = {"retries": 2, "retry_delay_seconds": [2, 10], "retry_condition_fn": _transient, "cache_policy": NO_CACHE}


@task(name="ingest", **_IO)
def ingest(cfg: RunConfig, date: str, client: Any, force: bool) -> dict[str, Any]:
    from pipeline.ingest import ingest_date

    r = ingest_date(
        date,
        root=cfg.root,
        input=cfg.input,
        ingest=cfg.ingest,
        client=client,
        force=force,
        storage_options=cfg.storage_options,
    )
    get_run_logger().info(
        "ingest %s: read %d, written %d, quarantined %d%s",
        date, r.rows_read, r.rows_written, r.rows_quarantined, " (already committed)" if r.skipped else "",
    )
    return _as_dict(r)


@task(name="vocab", **_IO)
def vocab(cfg: RunConfig, date: str, client: Any, force: bool) -> dict[str, Any]:
    from pipeline.vocab_stage import build_vocab

    r = build_vocab(
        date, root=cfg.root, vocab=cfg.vocab, fmt=cfg.input.format, client=client, force=force,
        storage_options=cfg.storage_options,
    )
    get_run_logger().info("vocab %s: %d keys admitted of %d seen, %d evicted", date, r.admitted, r.seen, r.evicted)
    return _as_dict(r)


@task(name="encode", **_IO)
def encode(cfg: RunConfig, date: str, client: Any, force: bool) -> dict[str, Any]:
    from pipeline.encode import encode_date

    r = encode_date(
        date, root=cfg.root, encode=cfg.encode, fmt=cfg.input.format, client=client, force=force,
        storage_options=cfg.storage_options,
    )
    get_run_logger().info("encode %s: %d train rows, %d eval rows", date, r.rows_train, r.rows_eval)
    return _as_dict(r)


@task(name="warm", **_IO)
def warm(cfg: RunConfig, date: str) -> dict[str, Any]:
    report = stages.warm_stage(cfg, date)
    get_run_logger().info("warm %s: %s", date, report)
    return report


@task(name="train", retries=1, retry_delay_seconds=5, retry_condition_fn=_transient, cache_policy=NO_CACHE)
def train(cfg: RunConfig, date: str) -> dict[str, Any]:
    result = stages.train_stage(cfg, date)
    get_run_logger().info("train %s: %s", date, result)
    return result


@task(name="evaluate", **_IO)
def evaluate(cfg: RunConfig, date: str) -> dict[str, Any]:
    result = stages.evaluate_stage(cfg, date)
    pub = result["published"]
    get_run_logger().info(
        "evaluate %s: new AUC %.4f logloss %.4f on %d rows; published %s",
        date, result["new"]["auc"], result["new"]["logloss"], result["new"]["rows"],
        f"AUC {pub['auc']:.4f}" if pub else "none",
    )
    return result


@task(name="publish", cache_policy=NO_CACHE)
def publish(cfg: RunConfig, date: str, evaluation: dict[str, Any], lineage: dict[str, Any]) -> dict[str, Any]:
    result = stages.publish_stage(cfg, date, evaluation, lineage)
    log = get_run_logger()
    if result["published"]:
        log.info("publish %s: version %s is now LATEST (%s)", date, result["version"], result["reason"])
    else:
        log.warning("publish %s: REFUSED version %s: %s", date, result["version"], result["reason"])
    return result


def _as_dict(obj: Any) -> dict[str, Any]:
    from dataclasses import asdict, is_dataclass

    return asdict(obj) if is_dataclass(obj) else dict(obj)
