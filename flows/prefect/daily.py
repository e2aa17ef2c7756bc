"""The Prefect flows: `daily_retrain` (one date) and `backfill` (a date range).

`daily_retrain` is `flows.day.run.run_day` with each stage run as a Prefect task (retried only where a
retry can succeed: transient I/O) and warm -> publish inside the model's slot, so two runs never
train or publish the same model at once: the node's kernel lock (`flows.node.locks`), behind the Prefect
server's concurrency slot with a renewed lease when the flow talks to a server
(`flows.prefect.slot`).  It returns the day's record.  A refused publish ends the flow in a `Failed`
state named `PublishRefused`, a day stopped by a data check in one named `DataCheckFailed` (not green,
visible in the UI, alerted on: `flows.prefect.alerts`): an expected outcome, not a crash, so the state's
data is a `GuardStopped` (Prefect raises a failed state's data for a caller asking for the result; it
carries the record) and its message names the model, the date and the reason; the run's log ends with
Prefect's one line `Finished in state PublishRefused('model ..., D: ...')`, not a traceback.  A run that
raises fails with `DailyRunError` naming the same.
The model's automations match flow runs by the tag `ctr-model:<model>-<root digest>`
(`flows.prefect.keys`), which a run must carry from its creation (Prefect reads a run's tags once, for its
first event): the model's deployments carry it, and `ctrpipe run`, `ctrpipe demo` and `backfill` start
their runs inside `model_tags(cfg)`.

Every run logs the digest of its config (`flows.prefect.keys.config_digest`; a deployment's config is
frozen at deploy time) and, once the day's record is written, replaces the model's Prometheus textfile
(`flows.metrics.textfile`) and shows the day as a markdown artifact keyed by model and root (`flows.prefect.artifact`).

Callers in this process (the CLI, `backfill`) call it through `call_daily_retrain`, which notes the
moment of the call, so the day's record counts Prefect's start (creating the flow run, and the
ephemeral API server for the first flow of a process) in its wall time.  A run a worker started
from a deployment is timed from the flow's body on.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from prefect import flow, get_run_logger, tags, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Failed

from flows.cli.console import SHOW, level_from
from flows.config import RunConfig, from_dict, with_overrides
from flows.day.record import (
    DayRecord,
    Status,
    is_completed,
    read_record,
)
from flows.day.run import DATA_STAGES, Stage, run_day
from flows.day.state import DayState
from flows.metrics import textfile
from flows.node.locks import Taken, node_slot
from flows.prefect.artifact import write_artifact
from flows.prefect.keys import config_digest, run_tags
from flows.prefect.slot import server_configured, server_slot
from flows.presets import default
from storage.io import dates
from storage.io.progress import Bar
from storage.io.registry import ModelRegistry

_CALLED_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("daily_retrain_called_at", default=None)
"""`time.perf_counter()` when `call_daily_retrain` called the flow (None: called otherwise)."""


class BackfillError(RuntimeError):
    """A date of a backfill failed; the message lists what completed before it."""


class DailyRunError(RuntimeError):
    """A stage of a daily run raised; the message names the model, the date and the stage's error.

    The stage's exception is also `error` (an argument, so it survives the pickling of Prefect's
    result store, which drops `__cause__`): the CLI reports it, having named the date itself.
    """

    def __init__(self, message: str, error: BaseException | None = None) -> None:
        super().__init__(message, error)

    @property
    def error(self) -> BaseException | None:
        return self.args[1] if len(self.args) > 1 else None

    def __str__(self) -> str:
        return str(self.args[0])


GUARD_STATES = {Status.REFUSED: "PublishRefused", Status.CHECK_FAILED: "DataCheckFailed"}
"""The `Failed` states a run stopped by the publish gate or a data check ends in, by record status."""


class GuardStopped(RuntimeError):
    """The publish gate refused the day's model, or a data check stopped the day: an expected outcome.

    The data of the run's `PublishRefused` / `DataCheckFailed` state: Prefect turns a failed state's data
    into the exception it raises for a caller that asks for the result (a dict there is its own
    `TypeError`).  `record` is the day's record (`DayRecord.to_dict()`), an argument so it survives pickling.
    """

    def __init__(self, message: str, record: dict[str, Any]) -> None:
        super().__init__(message, record)

    @property
    def record(self) -> dict[str, Any]:
        return dict(self.args[1])

    def __str__(self) -> str:
        return str(self.args[0])


class _GuardStopIsNotACrash(logging.Filter):
    """A worker's engine logs every failed run's exception as "Engine execution exited with unexpected
    exception" with its traceback; for a `GuardStopped` the state (and the engine's `Finished in state
    PublishRefused(...)` line) already says all, so that record is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, GuardStopped) and str(record.msg).startswith("Engine execution exited"))


logging.getLogger("prefect.flow_runs").addFilter(_GuardStopIsNotACrash())  # the engine's run logger


def _transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Retry condition: only I/O-level failures that a second attempt can fix (a flaky object store,
    a lost Dask worker, a torchrun rendezvous hiccup); data and config errors fail at once."""
    try:
        state.result()
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError):
        return False
    except (OSError, TimeoutError, ConnectionError):
        return True
    except Exception:
        return False
    return False


def prefect_runner(stage: Stage, cfg: RunConfig, state: DayState, **kw: Any) -> Any:
    """Run `stage` as a Prefect task with its retry policy and log its one-line summary."""
    run = task(
        name=stage.name,
        retries=stage.retries,
        retry_delay_seconds=[2.0, 10.0][: stage.retries] or 0,
        retry_condition_fn=_transient,
        cache_policy=NO_CACHE,
    )(stage.fn)
    t0 = time.perf_counter()
    result = run(cfg, state, **kw)
    get_run_logger().info("%s (%.1fs)", result.summary(), time.perf_counter() - t0, extra=SHOW)
    return result


def prefect_slot(cfg: RunConfig) -> AbstractContextManager[Taken]:
    """The model's slot for a flow run: the server's and the node's against a Prefect server, else the node's;
    waiting runs log through the run's logger."""
    run_id = str(flow_run.id) if flow_run.id else None
    slot = server_slot if server_configured() else node_slot
    return slot(cfg.layout(), cfg.publish.lock_timeout_s, log=get_run_logger(), flow_run=run_id)


def _config(config: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Sections given as a (possibly partial) dict over the defaults, then dotted-key overrides."""
    cfg = from_dict(config) if config else default()
    return with_overrides(cfg, overrides) if overrides else cfg


def resolve_date(date: str | None, scheduled: Any) -> str:
    """The date a run processes: the given one, else the day before the run's *scheduled* time.

    A scheduled run that starts late (a busy worker, an outage) still processes the day it was
    scheduled for, not the day the wall clock says.
    """
    if date:
        return dates.validate_date(date)
    when = scheduled if scheduled is not None else _dt.datetime.now(_dt.UTC)
    return (when.date() - _dt.timedelta(days=1)).isoformat()


def _scheduled_time() -> Any:
    try:
        return flow_run.scheduled_start_time
    except Exception:  # outside a flow run (direct .fn() call)
        return None


@flow(name="daily-retrain")
def daily_retrain(
    date: str | None = None,
    config: dict[str, Any] | None = None,
    force: bool = False,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Retrain on one day of logs and publish the model if it is not worse than the published one.

    Args:
        date: YYYY-MM-DD; empty means the day before the run's scheduled start (the `daily` deployment).
        config: config sections (see docs/config-reference.md); missing keys take their defaults.
        force: redo the date even if it completed, and recompute its committed stages.
        overrides: dotted keys, e.g. {"optim.k_steps": 20}.
    """
    called_at = _CALLED_AT.get()
    quiet_dask()
    date = resolve_date(date, _scheduled_time())
    cfg = _config(config, overrides)
    layout, digest = cfg.layout(), config_digest(cfg.to_dict())
    get_run_logger().info(
        "model %s on %s, %s, config %s (a deployment's config is the one given to `ctrpipe "
        "deploy`: edit the file and deploy again to change it)",
        cfg.model_name,
        cfg.root,
        date,
        digest,
    )
    with tags(f"date:{date}", *run_tags(layout)):
        try:
            day = run_day(cfg, date, force=force, runner=prefect_runner, slot=prefect_slot, called_at=called_at)
        except Exception as exc:
            _report_failed(cfg, date, digest)
            raise DailyRunError(f"model {cfg.model_name}, {date}: {type(exc).__name__}: {exc}", exc) from exc
    record = day.record
    if day.ran:
        _report(cfg, record, digest)
    if record.status in GUARD_STATES:
        what = (
            f"version {record.model_version} refused" if record.status == Status.REFUSED else "stopped before training"
        )
        message = f"model {cfg.model_name}, {date}: {what}: {record.reason}"
        return Failed(name=GUARD_STATES[record.status], message=message, data=GuardStopped(message, record.to_dict()))
    return record.to_dict()


def quiet_dask() -> None:
    """Dask's INFO lines (a cluster's scheduler and workers starting and stopping) only when asked for
    (`CTRPIPE_LOG_LEVEL=info`): a worker's flow run has no `ctrpipe` console to set the level
    (`flows.cli.console.configure`, whose choice stands when it ran)."""
    if "DASK_LOGGING__DISTRIBUTED" in os.environ:
        return
    level = level_from(False)
    os.environ["DASK_LOGGING__DISTRIBUTED"] = logging.getLevelName(level).lower()  # a local cluster's processes
    import distributed  # noqa: F401  # sets its loggers' levels on import: set ours after it

    logging.getLogger("distributed").setLevel(level)


def _report(cfg: RunConfig, record: DayRecord, digest: str) -> None:
    """After the day's record is written: the Prometheus textfile, then the artifact (both name the real LATEST)."""
    layout, log = cfg.layout(), get_run_logger()
    latest = ModelRegistry(layout).latest()
    try:
        log.info(
            "metrics for the platform's scraper: %s",
            textfile.write(layout, record, latest=latest, config_digest=digest),
        )
    except OSError as exc:  # the day's outcome stands; what reports it says why it is missing
        log.warning(
            "the metrics textfile %s was not written: %s (check that the root is writable)",
            layout.metrics_textfile(),
            exc,
        )
    write_artifact(cfg, record, latest=latest, digest=digest)


def _report_failed(cfg: RunConfig, date: str, digest: str) -> None:
    """`_report` of the failed record run_day wrote (naming the stage); its own errors never hide the run's."""
    try:
        failed = read_record(cfg.layout(), date)
        if failed is not None and not failed.completed:
            _report(cfg, failed, digest)
    except Exception as exc:
        get_run_logger().warning(
            "the failed day's metrics and artifact were not written: %s: %s", type(exc).__name__, exc
        )


def model_tags(cfg: RunConfig) -> AbstractContextManager[Any]:
    """Flow runs created inside carry `model:<name>` and `ctr-model:<model>-<root digest>`, which the
    model's alert automations match (`flows.prefect.keys.run_tags`)."""
    return tags(*run_tags(cfg.layout()))


def call_daily_retrain(date: str | None = None, **kw: Any) -> Any:
    """`daily_retrain(date, **kw)`, its record's wall time counted from this call (Prefect's start included)."""
    token = _CALLED_AT.set(time.perf_counter())
    try:
        return daily_retrain(date, **kw)
    finally:
        _CALLED_AT.reset(token)


def record_of(state: Any, layout: Any, date: str) -> DayRecord | None:
    """The record a `daily_retrain` subflow returned (completed, refused or stopped), else the one it wrote."""
    data = state.result(raise_on_failure=False)
    if isinstance(data, GuardStopped):
        data = data.record
    if isinstance(data, dict) and "completed" in data:
        return DayRecord.from_dict(data)
    return read_record(layout, date)  # it failed: its record names the stage's error


@flow(name="backfill")
def backfill(
    start: str,
    end: str,
    config: dict[str, Any] | None = None,
    force: bool = False,
    overrides: dict[str, Any] | None = None,
    ingest_ahead: int = 2,
) -> dict[str, Any]:
    """Run the daily flow for each date in order; completed dates are skipped unless `force`.

    Training is sequential (each day warm-starts from the previous model), so a failed date stops
    the backfill; rerunning it resumes at that date.  Ingest of the later pending dates is independent
    of training, so it runs ahead, up to `ingest_ahead` dates at once, while earlier dates train (not
    with `force`).  A refused publish is a completed date: the next day warm-starts from the last
    published model.
    """
    quiet_dask()
    cfg = _config(config, overrides)
    layout = cfg.layout()
    log = get_run_logger()
    days = dates.date_range(start, end)
    pending = [d for d in days if force or not is_completed(layout, d)]
    report: dict[str, list[str]] = {"completed": [], "skipped": [], "refused": [], "not_run": []}
    ahead: dict[str, Future] = {}
    close_ahead = None
    if ingest_ahead > 0 and not force and len(pending) > 1:
        ahead, close_ahead = _ingest_ahead(cfg, pending[1:], ingest_ahead)
    try:
        with Bar("backfill dates (skipped and run)", total=len(days)) as bar:
            for i, date in enumerate(days):
                bar.update(i)
                if date not in pending:
                    report["skipped"].append(date)
                    done = read_record(layout, date)
                    log.info(
                        "backfill: %s already completed (%s %s); skipped",
                        date,
                        done.status if done else "",
                        (done.model_version if done else "") or "",
                        extra=SHOW,
                    )
                    continue
                if date in ahead:
                    ahead[date].result()
                with model_tags(cfg):
                    state = call_daily_retrain(date, config=cfg.to_dict(), force=force, return_state=True)
                record = record_of(state, layout, date)
                status = record.status if record else Status.FAILED
                if status == Status.REFUSED:
                    report["refused"].append(date)
                elif state.is_completed():
                    report["completed"].append(date)
                else:
                    report["not_run"] = days[i + 1 :]
                    where = f" in {record.failed_stage}" if record and record.failed_stage else ""
                    raise BackfillError(
                        f"backfill {start}..{end} stopped at {date}{where}: "
                        f"{(record and record.reason) or state.message}\n"
                        f"  completed: {_dates(report['completed'])}; skipped (done before): "
                        f"{_dates(report['skipped'])}; refused: {_dates(report['refused'])}; "
                        f"not run: {_dates(report['not_run'])}\n"
                        f"  fix the cause and rerun the same backfill: it resumes at {date}"
                    )
                log.info("backfill: %s %s", date, status, extra=SHOW)
            bar.update(len(days))
    finally:
        if close_ahead is not None:
            close_ahead()
    return report


def _dates(days: list[str]) -> str:
    """`2026-01-01..2026-01-03` for a run of dates, a list otherwise, `none` when empty."""
    if not days:
        return "none"
    if len(days) > 2 and days == dates.date_range(days[0], days[-1]):
        return f"{days[0]}..{days[-1]}"
    return ", ".join(days)


def _ingest_ahead(cfg: RunConfig, days: list[str], width: int) -> tuple[dict[str, Future], Any]:
    """Ingest `days` in background threads, `width` at a time; returns per-date futures and a close function.

    A plain call, not a Prefect task: a date whose input is missing or bad must not be reported before
    the dates before it have trained.  Errors are swallowed here; the date's own daily run meets the
    same error when its turn comes, and reports it (its ingest finds committed work already done).
    Each daily run waits for its date's future first, so two ingests of one date never overlap.
    """
    from pipeline.cluster import dask_client

    layout = cfg.layout()
    ingest = next(s for s in DATA_STAGES if s.name == "ingest")
    stack = ExitStack()
    client = stack.enter_context(dask_client(cfg.dask))
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="ingest-ahead")
    stack.callback(pool.shutdown, wait=True, cancel_futures=True)  # runs before the client closes

    def quiet(date: str) -> None:
        try:
            ingest.fn(cfg, DayState(date=date, layout=layout), client=client)
        except Exception:  # reported by the date's own run
            return

    futures = {d: pool.submit(quiet, d) for d in days}
    return futures, stack.close
