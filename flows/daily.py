"""The daily retrain flow and the backfill flow.

`daily_retrain(date)` runs ingest -> vocab -> encode -> warm -> train ->
evaluate -> publish for one date and writes `<root>/runs/date=D/metrics.json`.
A date whose record says `completed` is not run again unless `force`; every
data stage also skips itself when its committed output is already there, so a
rerun after a crash resumes at the first stage that had not committed.

A refused publish ends the flow in a `Failed` state named `PublishRefused`
(not green, visible in the UI) while the record says why.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from flows import stages, tasks
from flows.config import RunConfig, from_dict
from flows.recipes import default
from storage import fsio
from storage.fsio import code_version


class BackfillError(RuntimeError):
    """A date of a backfill failed; the message lists what completed before it."""


def _config(config: dict[str, Any] | None) -> RunConfig:
    return from_dict(config) if config else default()


@flow(name="daily-retrain", flow_run_name="daily-retrain-{date}")
def daily_retrain(date: str, config: dict[str, Any] | None = None, force: bool = False) -> Any:
    """Retrain on one day of logs and publish the model if it is not worse than the published one."""
    from pipeline.cluster import dask_client

    fsio.validate_date(date)
    cfg = _config(config)
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
        with dask_client(cfg.dask) as client:
            ing = timed("ingest", tasks.ingest, cfg, date, client, force)
            voc = timed("vocab", tasks.vocab, cfg, date, client, force)
            enc = timed("encode", tasks.encode, cfg, date, client, force)
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
            "config": cfg.to_dict(),
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
    _artifact(record)
    if not pub["published"]:
        return Failed(name="PublishRefused", message=f"model {pub['version']} for {date} refused: {pub['reason']}")
    return stages.read_record(cfg, date)


def _failed_record(date: str, reason: str, seconds: dict[str, float]) -> stages.DayRecord:
    return stages.DayRecord(
        date=date, completed=False, status="failed", reason=reason, auc=None, logloss=None, published_auc=None,
        rows_read=0, rows_ingested=0, rows_quarantined=0, vocab_size=0, rows_train=0, rows_eval=0,
        published=False, model_version=None, latest_version=None, parent_version=None, train={}, warm={},
        seconds=seconds,
    )


def _artifact(r: stages.DayRecord) -> None:
    rows = [
        ("rows read / ingested / quarantined", f"{r.rows_read} / {r.rows_ingested} / {r.rows_quarantined}"),
        ("vocabulary (admitted keys)", f"{r.vocab_size}"),
        ("train / eval rows", f"{r.rows_train} / {r.rows_eval}"),
        ("AUC / logloss", f"{r.auc:.4f} / {r.logloss:.4f}"),
        ("published model AUC on same rows", "none" if r.published_auc is None else f"{r.published_auc:.4f}"),
        ("outcome", f"{r.status}: {r.reason}"),
        ("model version", f"{r.model_version} (LATEST = {r.latest_version})"),
    ]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    create_markdown_artifact(
        key=f"daily-retrain-{r.date}",
        markdown=f"# Daily retrain {r.date}\n\n| stage result | value |\n|---|---|\n{table}\n",
        description=f"Daily retrain {r.date}: {r.status}",
    )


@flow(name="backfill", flow_run_name="backfill-{start}-{end}")
def backfill(start: str, end: str, config: dict[str, Any] | None = None, force: bool = False) -> dict[str, Any]:
    """Run the daily flow for each date in order; completed dates are skipped unless `force`.

    Training is sequential (each day warm-starts from the previous model), so a
    failed date stops the backfill; rerunning it resumes at that date.  A
    refused publish is a completed date: the next day warm-starts from the last
    published model.
    """
    cfg = _config(config)
    log = get_run_logger()
    dates = fsio.date_range(start, end)
    report: dict[str, list[str]] = {"completed": [], "skipped": [], "refused": [], "not_run": []}
    for i, date in enumerate(dates):
        if not force and stages.is_completed(cfg, date):
            report["skipped"].append(date)
            continue
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
                f"Completed: {report['completed'] or 'none'}; skipped (already done): {report['skipped'] or 'none'}; "
                f"refused: {report['refused'] or 'none'}; not run: {report['not_run'] or 'none'}. "
                "Fix the cause and rerun the same backfill to resume."
            )
        log.info("backfill: %s %s", date, record.get("status"))
    return report
