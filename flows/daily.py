"""The Prefect flows: `daily_retrain` (one date) and `backfill` (a date range).

`daily_retrain` is `flows.day.run_day` with each stage run as a Prefect task (retried only where a
retry can succeed: transient I/O) and warm -> publish inside the model's Prefect concurrency slot
(`flows.locks`), so two runs never train or publish the same model at once.  It returns the day's
record; a refused publish ends the flow in a `Failed` state named `PublishRefused` (not green,
visible in the UI) whose data is the record.

Callers in this process (the CLI, `backfill`) call it through `call_daily_retrain`, which notes the
moment of the call, so the day's record counts Prefect's start (creating the flow run, and the
ephemeral API server for the first flow of a process) in its wall time.  A run a worker started
from a deployment is timed from the flow's body on.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from prefect import flow, get_run_logger, tags, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.states import Failed

from flows.config import RunConfig, from_dict, with_overrides
from flows.day import DATA_STAGES, Stage, run_day
from flows.history import HISTORY_DAYS
from flows.locks import model_slot
from flows.recipes import default
from flows.record import DayRecord, is_completed, read_record
from flows.state import DayState
from storage.io import dates
from storage.io.progress import Bar

_CALLED_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("daily_retrain_called_at", default=None)
"""`time.perf_counter()` when `call_daily_retrain` called the flow (None: called otherwise)."""


class BackfillError(RuntimeError):
    """A date of a backfill failed; the message lists what completed before it."""


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
        stage.fn, name=stage.name, retries=stage.retries, retry_delay_seconds=[2, 10][: stage.retries] or 0,
        retry_condition_fn=_transient, cache_policy=NO_CACHE,
    )
    result = run(cfg, state, **kw)
    get_run_logger().info("%s", result.summary())
    return result


def prefect_slot(cfg: RunConfig) -> AbstractContextManager[Any]:
    return model_slot(cfg.model_name, cfg.publish.lock_timeout_s)


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
        config: config sections (see README); missing keys take their defaults.
        force: redo the date even if it completed, and recompute its committed stages.
        overrides: dotted keys, e.g. {"optim.k_steps": 20}.
    """
    called_at = _CALLED_AT.get()
    date = resolve_date(date, _scheduled_time())
    cfg = _config(config, overrides)
    with tags(f"date:{date}", f"model:{cfg.model_name}"):
        day = run_day(cfg, date, force=force, runner=prefect_runner, slot=prefect_slot, called_at=called_at)
    record = day.record
    if day.ran:
        _artifact(cfg, record)
    if record.status == "refused":
        return Failed(name="PublishRefused", message=f"model {record.model_version} for {date} refused: "
                      f"{record.reason}", data=record.to_dict())
    return record.to_dict()


def call_daily_retrain(date: str | None = None, **kw: Any) -> Any:
    """`daily_retrain(date, **kw)`, its record's wall time counted from this call (Prefect's start included)."""
    token = _CALLED_AT.set(time.perf_counter())
    try:
        return daily_retrain(date, **kw)
    finally:
        _CALLED_AT.reset(token)


def _artifact(cfg: RunConfig, r: DayRecord) -> None:
    """A markdown table of the stage results and the 30-day AUC/logloss chart, shown in the Prefect UI."""
    def f4(v: float | None) -> str:
        return "none" if v is None else f"{v:.4f}"

    rows = [
        ("rows read / ingested / quarantined", f"{r.rows_read} / {r.rows_ingested} / {r.rows_quarantined}"),
        ("vocabulary (admitted keys)", f"{r.vocab_size}"),
        ("train / eval rows", f"{r.rows_train} / {r.rows_eval}"),
        ("AUC / logloss", f"{f4(r.auc)} / {f4(r.logloss)}"),
        ("published model AUC on the same eval rows", f4(r.published_auc)),
        ("next-day AUC of the published model (a sample of today's train rows)", _next_day(r)),
        ("outcome", f"{r.status}: {r.reason}"),
        ("model version", f"{r.model_version} (LATEST = {r.latest_version})"),
        ("wall time (of which training)", f"{r.wall_s:.1f} s ({r.seconds.get('train', 0.0):.1f} s)"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    chart = cfg.layout().run_history(r.date)
    create_markdown_artifact(
        key=f"daily-retrain-{r.date}",
        markdown=(
            f"# Daily retrain {r.date}\n\n| stage result | value |\n|---|---|\n{table}\n\n"
            f"AUC and logloss over the last {HISTORY_DAYS} days: `{chart}`\n"
        ),
        description=f"Daily retrain {r.date}: {r.status}",
    )


def _next_day(r: DayRecord) -> str:
    nd = r.evaluate.get("next_day")
    if not nd:
        return "none"
    lo, hi = nd["auc_ci95"]
    return f"{nd['auc']:.4f} [{lo:.4f}, {hi:.4f}] on {nd['rows']} of {nd['of_rows']} rows"


def record_of(state: Any, layout: Any, date: str) -> DayRecord | None:
    """The record a `daily_retrain` subflow returned (completed or refused), else the one it wrote."""
    data = state.result(raise_on_failure=False)
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
                    continue
                if date in ahead:
                    ahead[date].result()
                state = call_daily_retrain(date, config=cfg.to_dict(), force=force, return_state=True)
                record = record_of(state, layout, date)
                status = record.status if record else "failed"
                if status == "refused":
                    report["refused"].append(date)
                elif state.is_completed():
                    report["completed"].append(date)
                else:
                    report["not_run"] = days[i + 1 :]
                    raise BackfillError(
                        f"backfill {start}..{end} stopped at {date}: {(record and record.reason) or state.message}. "
                        f"Completed: {report['completed'] or 'none'}; skipped (already done): "
                        f"{report['skipped'] or 'none'}; refused: {report['refused'] or 'none'}; "
                        f"not run: {report['not_run'] or 'none'}. Fix the cause and rerun the same backfill to resume."
                    )
                log.info("backfill: %s %s", date, status)
            bar.update(len(days))
    finally:
        if close_ahead is not None:
            close_ahead()
    return report


def _ingest_ahead(cfg: RunConfig, days: list[str], width: int) -> tuple[dict[str, Future], Any]:
    """Ingest `days` in background threads, `width` at a time; returns per-date futures and a close function.

    Errors are swallowed here: the date's own daily run meets the same error, in order, and reports it.
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
            prefect_runner(ingest, cfg, DayState(date=date, layout=layout), client=client)
        except Exception:  # reported by the date's own run
            return

    # copy_context: the tasks run as part of this backfill's flow run
    futures = {d: pool.submit(contextvars.copy_context().run, quiet, d) for d in days}
    return futures, stack.close
