"""The day's row accounting, summed from the ingest tasks' results, and the check that it may be committed.

Pure: the tasks' results in (`pipeline.ingest.tasks.ingest_file`, one per file or byte range), `DayTotals`
and the two manifests out (`pipeline.ingest.manifest`), or an `IngestError` saying why the day is refused.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipeline.ingest import bad_rows
from pipeline.ingest.day_stats import add_stats, empty_stats
from pipeline.ingest.error import IngestError
from pipeline.ingest.manifest import EventsManifest, Part, QuarantineManifest
from pipeline.schema import LogSchema

COUNTED = ("rows_read", "rows_written", "rows_quarantined", "rows_other_dates", "rows_padded")
"""The row counts a task returns and the day sums."""


@dataclass(frozen=True)
class DayTotals:
    """The day's rows in numbers, its parts and its bad rows: both manifests but their run ids."""

    date: str
    format: str
    schema_digest: str
    rows_read: int
    rows_written: int
    rows_quarantined: int
    rows_other_dates: int
    rows_padded: int
    stats: dict[str, Any]
    parts: tuple[Part, ...]
    quarantine_parts: tuple[Part, ...]
    reasons: dict[str, int]
    """Quarantined rows by reason, most common first."""
    samples: dict[str, dict[str, Any]]
    """Reason -> its first row (`pipeline.ingest.bad_rows`)."""
    inputs: tuple[dict[str, Any], ...]
    slow_chunks: int

    def events_manifest(
        self, *, run_id: str, code_version: str, rows_per_partition: int, blocks: int
    ) -> EventsManifest:
        """The events manifest of these rows, committed with the quarantine of run `run_id`."""
        return EventsManifest(
            date=self.date,
            format=self.format,
            schema_digest=self.schema_digest,
            rows_read=self.rows_read,
            rows_written=self.rows_written,
            rows_quarantined=self.rows_quarantined,
            rows_other_dates=self.rows_other_dates,
            rows_padded=self.rows_padded,
            stats=self.stats,
            parts=self.parts,
            reasons=self.reasons,
            inputs=self.inputs,
            slow_chunks=self.slow_chunks,
            run_id=run_id,
            quarantine_run_id=run_id,
            code_version=code_version,
            rows_per_partition=rows_per_partition,
            blocks=blocks,
        )

    def quarantine_manifest(self, *, run_id: str, code_version: str) -> QuarantineManifest:
        """The quarantine manifest of these rows, committed with the events of run `run_id`."""
        return QuarantineManifest(
            date=self.date,
            rows_quarantined=self.rows_quarantined,
            parts=self.quarantine_parts,
            reasons=self.reasons,
            samples=self.samples,
            run_id=run_id,
            events_run_id=run_id,
            code_version=code_version,
        )


def per_file(per_task: list[dict], schema: LogSchema) -> list[dict]:
    """Task results (one per file or byte range) summed per file, in task order."""
    out: dict[str, dict] = {}
    for r in per_task:
        acc = out.setdefault(
            r["file"],
            {
                "file": r["file"],
                "parts": [],
                "quarantine_parts": [],
                "reasons": Counter(),
                "stats": empty_stats(schema),
                "samples": {},
            },
        )
        for k, v in r.items():
            if isinstance(v, int):
                acc[k] = acc.get(k, 0) + v
        acc["parts"] += r["parts"]
        acc["quarantine_parts"] += r["quarantine_parts"]
        acc["reasons"].update(r["reasons"])
        acc["stats"] = add_stats(acc["stats"], r["stats"])
        bad_rows.merge_samples(acc["samples"], r.get("samples", {}))
    return [{**v, "reasons": dict(v["reasons"])} for v in out.values()]


def summarize(date: str, schema: LogSchema, inputs: list[dict], files: list[dict]) -> DayTotals:
    """The day's totals from the per-file results (`per_file`)."""
    totals: Counter[str] = Counter()
    reasons: Counter = Counter()
    stats = empty_stats(schema)
    samples: dict[str, dict] = {}
    for r in files:
        totals.update({k: r.get(k, 0) for k in COUNTED})
        reasons.update(r["reasons"])
        stats = add_stats(stats, r["stats"])
        bad_rows.merge_samples(samples, r.get("samples", {}))

    def parts(key: str) -> tuple[Part, ...]:
        return tuple(
            Part(p["name"], p["rows"]) for p in sorted((p for r in files for p in r[key]), key=lambda p: p["name"])
        )

    return DayTotals(
        date=date,
        format=schema.name,
        schema_digest=schema.digest(),
        **{k: int(totals[k]) for k in COUNTED},
        stats=stats,
        parts=parts("parts"),
        quarantine_parts=parts("quarantine_parts"),
        reasons=dict(reasons.most_common()),
        samples=samples,
        inputs=tuple(inputs),
        slow_chunks=int(sum(r.get("slow_chunks", 0) for r in files)),
    )


def check_quality(day: DayTotals, files: list[dict], max_bad_fraction: float, *, schema: LogSchema, fmt: str) -> None:
    """Raise IngestError when the date has no valid rows or too many bad ones.

    The bad share is quarantined / rows read: a line whose timestamp does not read has no date, so a file of
    several days has its bad lines counted by each date it is ingested for, against all of its lines.
    The message names the top reasons with a sample line each and the likely fix (`pipeline.ingest.bad_rows`);
    `fmt` is `input.format` as configured.
    """
    date = day.date
    names = ", ".join(r["file"] for r in files)
    if day.rows_read == 0:
        raise IngestError(
            f"no rows for {date}: {names} {'is' if len(files) == 1 else 'are'} empty"
            f"{' (or holds the header only)' if schema.has_header else ''}; check that the day's logs were written "
            "completely, and input.url",
            kind="no_rows",
        )
    if day.rows_written == 0 and day.rows_quarantined == 0:
        raise IngestError(
            f"no rows of {date} in {names}: all {day.rows_other_dates} rows are of other dates; "
            "check input.url and the date",
            kind="no_rows",
        )
    if day.rows_quarantined / day.rows_read > max_bad_fraction:
        raise IngestError(
            "\n".join(_too_many_bad_rows(day, files, max_bad_fraction, schema=schema, fmt=fmt)),
            kind="too_many_bad_rows",
        )


def _too_many_bad_rows(
    day: DayTotals, files: list[dict], max_bad_fraction: float, *, schema: LogSchema, fmt: str
) -> list[str]:
    """The lines of the error of a day with too many bad rows: the share, the top reasons, the worst files, a fix."""
    bad, read = day.rows_quarantined, day.rows_read
    lines = [
        f"ingest of {day.date}: {read} rows read = {day.rows_written} valid + {bad} quarantined ({bad / read:.2%}) "
        f"+ {day.rows_other_dates} dated elsewhere; quarantined over ingest.max_bad_fraction={max_bad_fraction}, "
        "nothing was committed"
    ]
    lines += [f"  {line}" for line in bad_rows.describe_reasons(day.reasons, day.samples)]
    if len(files) > 1:
        worst = sorted(files, key=lambda r: r.get("rows_quarantined", 0), reverse=True)[:3]
        lines.append(
            "  worst files: "
            + "; ".join(
                f"{r['file']} ({r.get('rows_quarantined', 0)} bad of {r.get('rows_read', 0)})"
                for r in worst
                if r.get("rows_quarantined", 0)
            )
        )
    lines.append(
        "  "
        + bad_rows.advice(
            day.reasons,
            day.samples,
            share=bad / read,
            schema=schema,
            format_key="input.format",
            fmt=fmt,
            tolerance=f"raise ingest.max_bad_fraction (now {max_bad_fraction})",
        )
    )
    return lines
