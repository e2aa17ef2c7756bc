"""The day's record, `runs/<model>/date=D/metrics.json`: what one daily run did, read by the CLI, the
backfill, the history chart and the next run (a completed date is not run again)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from storage.io import codec, dates, fsio, records
from storage.io.layout import Layout

DAY_RECORD = records.RecordFormat("ctr-pipeline-day-record", 1, absent=1)
"""metrics.json: version 1 (a file written before the `format` field existed is version 1 too)."""


class Status(StrEnum):
    """How a day's run ended (`DayRecord.status`).  A `StrEnum`: metrics.json keeps the plain strings,
    and a status read back compares equal to its member."""

    PUBLISHED = "published"
    """The candidate passed the gate and `LATEST` names it."""
    REFUSED = "refused"
    """The gate said no; `LATEST` unchanged."""
    CHECK_FAILED = "check_failed"
    """A data check stopped the day before training."""
    FAILED = "failed"
    """A stage raised."""


@dataclass(frozen=True, kw_only=True)
class DayRecord:
    """`runs/<model>/date=D/metrics.json` (read tolerantly: `storage.io.records`)."""

    format: str = DAY_RECORD.tag
    date: str
    completed: bool
    status: Status
    """How the run ended (`Status`); read from metrics.json as its string and made a `Status` here."""
    reason: str
    failed_stage: str = ""
    """The stage that raised, when `status` is `failed` (empty if it failed before any stage)."""
    auc: float | None = None
    logloss: float | None = None
    published_auc: float | None = None
    """AUC of the previously published model on the same eval rows."""
    next_day_auc: float | None = None
    """AUC of the previously published model on this day's train rows (unseen by it): what production saw."""
    rows_read: int = 0
    rows_ingested: int = 0
    rows_quarantined: int = 0
    rows_other_dates: int = 0
    """Rows read of a valid timestamp of another date: rows_read = rows_ingested + rows_quarantined + this."""
    vocab_size: int = 0
    rows_train: int = 0
    rows_eval: int = 0
    published: bool = False
    model_version: str | None = None
    latest_version: str | None = None
    parent_version: str | None = None
    train: dict[str, Any] = field(default_factory=dict)
    """The train stage's results (steps, examples, losses, rates, warm start) and `recipe`: the optim values
    and dropout derived for the day's size and why (`trainer.plan.recipe.Recipe.record`)."""
    warm: dict[str, Any] = field(default_factory=dict)
    """The warm stage's scalar results."""
    evaluate: dict[str, Any] = field(default_factory=dict)
    """The evaluate stage's scalar results: rows scored, rows/s, the next-day sample and the AUC's interval."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each stage and of the run's overheads (`flows.day.run.OVERHEADS`), in the order they ran."""
    wall_s: float = 0.0
    """Wall seconds of the run from the flow's call (or `run_day`'s start) to the record: the parts of
    `seconds` add up to it."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    """The data checks: {name, status (pass, warn, fail), value, threshold, detail} (`flows.guards.data_checks`)."""
    checks_note: str = ""
    """Which data checks did not run and why (e.g. fewer than 2 completed days before this one)."""
    checks_window: list[str] = field(default_factory=list)
    """The completed days the data checks compared with."""
    data_stats: dict[str, Any] = field(default_factory=dict)
    """The day's checked series (`flows.guards.data_checks.data_stats`): what later days compare with."""
    gate: list[dict[str, Any]] = field(default_factory=list)
    """The publish gate's checks: {name, passed, value, threshold, detail, interval, undecided} 
    (`flows.guards.gate`)."""
    gate_verdict: str = ""
    """The gate's verdict: `passed`, `refused` or `undecided: <why>` (empty: the gate did not run)."""
    gate_evidence: dict[str, Any] = field(default_factory=dict)
    """What the gate's comparisons read: `rows`, `positives`, `auc_se` (of the AUC difference; for a first model,
    of its AUC) and `dates` (the day's, or the pooled ones: `flows.guards.pool`)."""
    eval_positives: int = 0
    """Positives (clicks) among the day's `rows_eval`."""
    slot_wait_s: float = 0.0
    """Seconds the run waited for the model's train/publish slot (another run of the model held it)."""

    def __post_init__(self) -> None:
        # metrics.json holds the plain string, which the codec hands over as it is
        if self.status not in Status.__members__.values():
            raise ValueError(f"status {self.status!r} is not one of {', '.join(Status)}")
        object.__setattr__(self, "status", Status(self.status))

    def to_dict(self) -> dict[str, Any]:
        # plain data: the status's string, not the member; the format this code writes
        return {**codec.encode(self), "status": str(self.status), "format": DAY_RECORD.tag}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "metrics.json") -> DayRecord:
        """The record in a metrics.json's content: fields this code does not know are ignored.

        Raises:
            FormatError: a version this code does not read (the message says what to do).
            ConfigError: a known field of the wrong type (named).
        """
        return records.read_record(cls, data, fmt=DAY_RECORD, where=where)


def write_record(layout: Layout, record: DayRecord) -> None:
    fs, path = layout.fs(layout.run_record(record.date))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fsio.write_text_atomic(fs, path, json.dumps(record.to_dict(), indent=2, default=str))


def read_record(layout: Layout, date: str) -> DayRecord | None:
    fs, path = layout.fs(layout.run_record(date))
    if not fs.exists(path):
        return None
    return DayRecord.from_dict(fsio.read_json(fs, path), where=layout.run_record(date))


def is_completed(layout: Layout, date: str) -> bool:
    record = read_record(layout, date)
    return bool(record and record.completed)


def recent_records(layout: Layout, date: str, days: int) -> list[DayRecord]:
    """Records of the `days` dates ending at `date` that have one, oldest first."""
    window = dates.date_range(dates.shift_date(date, -(days - 1)), date)
    return [r for d in window if (r := read_record(layout, d))]
