"""The last daily run of a model as a Prometheus textfile: `<root>/metrics/<model>.prom` (`Layout.metrics_textfile`).

node-exporter's textfile collector (`--collector.textfile.directory=<root>/metrics`) exposes it beside
the host's metrics, so the daily numbers reach the place a platform scrapes without a push gateway:

    ctrpipe_run_info{model, root, date, status, version, latest, config}   1
    ctrpipe_run_completion_timestamp_seconds                               when the run wrote its record
    ctrpipe_run_date_timestamp_seconds                                     the date it processed (00:00 UTC)
    ctrpipe_run_status{status}                                             1 for how it ended, 0 for the others
    ctrpipe_run_published                                                  1 when it moved LATEST
    ctrpipe_run_stage_seconds{stage}                                       wall seconds of each stage and overhead
    ctrpipe_run_wall_seconds                                               the whole run
    ctrpipe_run_rows{kind}                                                 read, ingested, quarantined, train, eval
    ctrpipe_run_vocab_size                                                 admitted keys
    ctrpipe_run_auc, ctrpipe_run_logloss                                   the candidate on the eval rows (when trained)
    ctrpipe_run_published_auc                                              LATEST's AUC on the same rows (when any)

Written with prometheus_client (a registry per file, `collect`).  Every series carries `model` and `root`
(`flows.prefect.keys.model_key`'s digest) labels.  The file is replaced atomically (a temporary file renamed
over it), so the collector never reads half a file; it holds the last run only: a platform keeps the history.
Alert on `ctrpipe_run_status{status="published"} == 0` or on `time() - ctrpipe_run_completion_timestamp_seconds
> 26 * 3600`.
"""

from __future__ import annotations

import datetime as _dt

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from flows.day.record import DayRecord, Status
from storage.io import fsio
from storage.io.layout import Layout, root_digest

PREFIX = "ctrpipe_run"


def collect(
    record: DayRecord, *, model: str, root: str, latest: str | None, config_digest: str = "", written_at: float
) -> CollectorRegistry:
    """The record's numbers as gauges, one family per number (a number the record lacks: no family), in a
    registry of their own.

    Args:
        root: the root's digest (the `root` label).
        latest: the version LATEST names now (a stopped or failed day's record does not know it).
        written_at: Unix seconds of the run's end.
    """
    registry = CollectorRegistry()
    base = {"model": model, "root": root}

    def gauge(name: str, help_: str, *samples: tuple[dict[str, str], float | None]) -> None:
        kept = [(labels, float(v)) for labels, v in samples if v is not None]
        if kept:
            family = Gauge(f"{PREFIX}_{name}", help_, [*base, *kept[0][0]], registry=registry)
            for labels, v in kept:
                family.labels(**base, **labels).set(v)

    info = {
        "date": record.date,
        "status": str(record.status),
        "version": record.model_version or "",
        "latest": latest or "",
        "config": config_digest,
    }
    gauge("info", "The last daily run: its date, outcome, version, LATEST and config digest.", (info, 1))
    gauge("completion_timestamp_seconds", "Unix time the last daily run wrote its record.", ({}, written_at))
    day = _dt.datetime.fromisoformat(record.date).replace(tzinfo=_dt.UTC).timestamp()
    gauge("date_timestamp_seconds", "The date the last daily run processed (00:00 UTC).", ({}, day))
    gauge(
        "status",
        "1 for how the last daily run ended, 0 for the other outcomes.",
        *(({"status": str(s)}, 1.0 if record.status == s else 0.0) for s in Status),
    )
    gauge("published", "1 when the last daily run moved LATEST.", ({}, 1.0 if record.published else 0.0))
    gauge(
        "stage_seconds",
        "Wall seconds of each stage and overhead of the last daily run.",
        *(({"stage": stage}, s) for stage, s in record.seconds.items()),
    )
    gauge("wall_seconds", "Wall seconds of the last daily run.", ({}, record.wall_s))
    gauge(
        "rows",
        "Rows of the last daily run by kind.",
        ({"kind": "read"}, record.rows_read),
        ({"kind": "ingested"}, record.rows_ingested),
        ({"kind": "quarantined"}, record.rows_quarantined),
        ({"kind": "train"}, record.rows_train),
        ({"kind": "eval"}, record.rows_eval),
    )
    gauge("vocab_size", "Admitted vocabulary keys of the last daily run.", ({}, record.vocab_size))
    gauge("auc", "AUC of the last daily run's model on its eval rows.", ({}, record.auc))
    gauge("logloss", "Log loss of the last daily run's model on its eval rows.", ({}, record.logloss))
    gauge("published_auc", "AUC of the published model on the same eval rows.", ({}, record.published_auc))
    return registry


def render(
    record: DayRecord, *, model: str, root: str, latest: str | None, config_digest: str = "", written_at: float
) -> str:
    """`collect`'s gauges in the Prometheus text exposition format (version 0.0.4)."""
    registry = collect(
        record, model=model, root=root, latest=latest, config_digest=config_digest, written_at=written_at
    )
    return generate_latest(registry).decode()


def write(
    layout: Layout, record: DayRecord, *, latest: str | None, config_digest: str = "", written_at: float | None = None
) -> str:
    """Replace `Layout.metrics_textfile` with the record's numbers; returns its URL."""
    import time

    text = render(
        record,
        model=layout.model_name,
        root=root_digest(layout.root),
        latest=latest,
        config_digest=config_digest,
        written_at=time.time() if written_at is None else written_at,
    )
    url = layout.metrics_textfile()
    fs, path = layout.fs(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fsio.write_text_atomic(fs, path, text)
    return url
