"""The daily retrain flow and the backfill flow.

`daily_retrain(date)` runs ingest -> vocab -> encode -> warm -> train ->
evaluate -> publish for one date and writes `<root>/runs/date=D/metrics.json`.
A date whose record says `completed` is not run again unless `force`; every
data stage also skips itself when its committed output is already there, so a
rerun after a crash resumes at the first stage that had not committed.

Warm -> publish run inside the model's single Prefect concurrency slot
(`flows.locks`), so two runs never train or publish the same model at once.

A refused publish ends the flow in a `Failed` state named `PublishRefused`
(not green, visible in the UI) while the record says why.
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from prefect import flow, get_run_logger, tags
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.states import Failed

from flows import stages, tasks
from flows.config import RunConfig, from_dict, with_overrides
from flows.history import HISTORY_DAYS, write_history_png
from flows.locks import model_slot
from flows.recipes import default
from storage import fsio
from storage.fsio import code_version
from trainer.progress import Bar


class BackfillError(RuntimeError):
    """A date of a backfill failed; the message lists what completed before it."""


def _config(config: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Sections given as a (possibly partial) dict over the defaults, then dotted-key overrides."""
    cfg = from_dict(config) if config else default()
    return with_overrides(cfg, overrides) if overrides else cfg


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
        overrides: dotted keys, e.g. {"trainer.k_steps": 20}.
    """
    from pipeline.cluster import dask_client

    date = stages.resolve_date(date, _scheduled_time())
    cfg = _config(config, overrides)
    log = get_run_logger()
    if not force and stages.is_completed(cfg, date):
        log.info("%s already completed; nothing to do (use force to redo it)", date)
        return stages.read_record(cfg, date)

    seconds: dict[str, float] = {}

    def timed(name: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        seconds[name] = round(time.perf_counter() - t0, 3)
        return out

    try:
        with tags(f"date:{date}", f"model:{cfg.model_name}"):
            with dask_client(cfg.dask) as client:
                ing = timed("ingest", tasks.ingest, cfg, date, client, force)
                voc = timed("vocab", tasks.vocab, cfg, date, client, force)
                enc = timed("encode", tasks.encode, cfg, date, client, force)
            with model_slot(cfg.model_name, cfg.publish.lock_timeout_s):
                warm = timed("warm", tasks.warm, cfg, date)
                tr = timed("train", tasks.train, cfg, date)
                ev = timed("evaluate", tasks.evaluate, cfg, date)
                lineage = {
                    "date": date,
                    "dates_trained": [date],
                    "parent_version": tr.get("parent_version"),
                    "inputs": ing.get("inputs"),
                    "ingest": {k: ing.get(k) for k in ("rows_read", "rows_written", "rows_quarantined")},
                    "vocab_date": date,
                    "config": stages.redacted(cfg.to_dict()),
                    "code_version": code_version(),
                }
                pub = timed("publish", tasks.publish, cfg, date, ev, lineage)
    except Exception as exc:
        stages.write_record(cfg, _failed_record(date, f"{type(exc).__name__}: {exc}", seconds))
        raise

    record = stages.DayRecord(
        date=date,
        completed=True,
        status="published" if pub["published"] else "refused",
        reason=pub["reason"],
        auc=ev["new"]["auc"],
        logloss=ev["new"]["logloss"],
        published_auc=(ev["published"] or {}).get("auc"),
        next_day_auc=(ev["next_day"] or {}).get("auc"),
        rows_read=ing["rows_read"],
        rows_ingested=ing["rows_written"],
        rows_quarantined=ing["rows_quarantined"],
        vocab_size=voc["admitted"],
        rows_train=enc["rows_train"],
        rows_eval=enc["rows_eval"],
        published=pub["published"],
        model_version=pub["version"],
        latest_version=pub["latest"],
        parent_version=tr.get("parent_version"),
        train={k: v for k, v in tr.items() if isinstance(v, int | float | str | type(None))},
        warm={k: v for k, v in warm.items() if isinstance(v, int | float | str | type(None))},
        seconds=seconds,
    )
    stages.write_record(cfg, record)
    _artifact(cfg, record)
    if not pub["published"]:
        return Failed(name="PublishRefused", message=f"model {pub['version']} for {date} refused: {pub['reason']}")
    return stages.read_record(cfg, date)


def _failed_record(date: str, reason: str, seconds: dict[str, float]) -> stages.DayRecord:
    return stages.DayRecord(
        date=date, completed=False, status="failed", reason=reason, auc=None, logloss=None, published_auc=None,
        next_day_auc=None, rows_read=0, rows_ingested=0, rows_quarantined=0, vocab_size=0, rows_train=0,
        rows_eval=0, published=False, model_version=None, latest_version=None, parent_version=None, train={},
        warm={}, seconds=seconds,
    )


def _artifact(cfg: RunConfig, r: stages.DayRecord) -> None:
    """A markdown table of the stage results and the 30-day AUC/logloss chart, shown in the Prefect UI."""
    def f4(v: float | None) -> str:
        return "none" if v is None else f"{v:.4f}"

    rows = [
        ("rows read / ingested / quarantined", f"{r.rows_read} / {r.rows_ingested} / {r.rows_quarantined}"),
        ("vocabulary (admitted keys)", f"{r.vocab_size}"),
        ("train / eval rows", f"{r.rows_train} / {r.rows_eval}"),
        ("AUC / logloss", f"{f4(r.auc)} / {f4(r.logloss)}"),
        ("published model AUC on the same eval rows", f4(r.published_auc)),
        ("next-day AUC of the published model (today's train rows)", f4(r.next_day_auc)),
        ("outcome", f"{r.status}: {r.reason}"),
        ("model version", f"{r.model_version} (LATEST = {r.latest_version})"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    chart = write_history_png(
        cfg.root, r.date, stages.recent_records(cfg, r.date, HISTORY_DAYS), cfg.storage_options
    )
    create_markdown_artifact(
        key=f"daily-retrain-{r.date}",
        markdown=(
            f"# Daily retrain {r.date}\n\n| stage result | value |\n|---|---|\n{table}\n\n"
            f"AUC and logloss over the last {HISTORY_DAYS} days: `{chart}`\n"
        ),
        description=f"Daily retrain {r.date}: {r.status}",
    )


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

    Training is sequential (each day warm-starts from the previous model), so a
    failed date stops the backfill; rerunning it resumes at that date.  Ingest
    of the later pending dates is independent of training, so it runs ahead, up
    to `ingest_ahead` dates at once, while earlier dates train (not with `force`).  A refused publish
    is a completed date: the next day warm-starts from the last published model.
    """
    cfg = _config(config, overrides)
    log = get_run_logger()
    dates = fsio.date_range(start, end)
    pending = [d for d in dates if force or not stages.is_completed(cfg, d)]
    report: dict[str, list[str]] = {"completed": [], "skipped": [], "refused": [], "not_run": []}
    ahead: dict[str, Future] = {}
    close_ahead = None
    if ingest_ahead > 0 and not force and len(pending) > 1:
        ahead, close_ahead = _ingest_ahead(cfg, pending[1:], ingest_ahead)
    try:
        with Bar("backfill dates (skipped and run)", total=len(dates)) as bar:
            for i, date in enumerate(dates):
                bar.update(i)
                if date not in pending:
                    report["skipped"].append(date)
                    continue
                if date in ahead:
                    ahead[date].result()
                state = daily_retrain(date, config=cfg.to_dict(), force=force, return_state=True)
                record = stages.read_record(cfg, date) or {}
                if record.get("status") == "refused":
                    report["refused"].append(date)
                elif state.is_completed():
                    report["completed"].append(date)
                else:
                    report["not_run"] = dates[i + 1 :]
                    raise BackfillError(
                        f"backfill {start}..{end} stopped at {date}: {record.get('reason') or state.message}. "
                        f"Completed: {report['completed'] or 'none'}; skipped (already done): "
                        f"{report['skipped'] or 'none'}; refused: {report['refused'] or 'none'}; "
                        f"not run: {report['not_run'] or 'none'}. Fix the cause and rerun the same backfill to resume."
                    )
                log.info("backfill: %s %s", date, record.get("status"))
            bar.update(len(dates))
    finally:
        if close_ahead is not None:
            close_ahead()
    return report


def _ingest_ahead(cfg: RunConfig, dates: list[str], width: int) -> tuple[dict[str, Future], Any]:
    """Ingest `dates` in background threads, `width` at a time; returns per-date futures and a close function.

    Errors are swallowed here: the date's own daily run meets the same error, in order, and reports it.
    Each daily run waits for its date's future first, so two ingests of one date never overlap.
    """
    from pipeline.cluster import dask_client

    stack = ExitStack()
    client = stack.enter_context(dask_client(cfg.dask))
    pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="ingest-ahead")
    stack.callback(pool.shutdown, wait=True, cancel_futures=True)  # runs before the client closes

    def quiet(date: str) -> None:
        try:
            tasks.ingest(cfg, date, client, False)
        except Exception:  # reported by the date's own run
            return

    # copy_context: the tasks run as part of this backfill's flow run
    futures = {d: pool.submit(contextvars.copy_context().run, quiet, d) for d in dates}
    return futures, stack.close
