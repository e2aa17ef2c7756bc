"""Per-field numbers of a vocabulary: the manifest's `per_field`, report.parquet and report.md.

Each bucket task returns its `FieldTotals` (plain sums, so buckets add up);
the driver turns the total into shares of the day's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.config import VocabConfig


@dataclass(frozen=True, slots=True)
class FieldTotals:
    """Per-field sums behind the report, one int64 entry per field index; buckets add up."""

    seen: np.ndarray
    admitted: np.ndarray
    evicted: np.ndarray
    covered: np.ndarray
    """Today's occurrences of admitted keys."""
    present: np.ndarray
    """Today's occurrences of non-missing values."""
    known: np.ndarray
    """Today's occurrences of keys the previous vocabulary admitted (what yesterday's model knows)."""
    distinct: np.ndarray
    """Distinct keys seen today."""

    @staticmethod
    def zeros(n_fields: int) -> FieldTotals:
        """The sums of no key (the start of a sum over buckets)."""
        return FieldTotals(*(np.zeros(n_fields, np.int64) for _ in range(7)))

    def __add__(self, other: FieldTotals) -> FieldTotals:
        return FieldTotals(*(a + b for a, b in zip(self._parts(), other._parts(), strict=True)))

    def _parts(self) -> tuple[np.ndarray, ...]:
        return (self.seen, self.admitted, self.evicted, self.covered, self.present, self.known, self.distinct)


def field_totals(
    *,
    field: np.ndarray,
    count: np.ndarray,
    admitted: np.ndarray,
    evicted: np.ndarray,
    today: np.ndarray,
    was_admitted: np.ndarray,
    n_fields: int,
) -> FieldTotals:
    """Report sums of a set of keys (a bucket or the whole table) for fields 0..n_fields-1.

    Args:
        field, count, admitted, evicted: per key (after the cap).
        today: the key's count on the run date (0 when not seen today).
        was_admitted: per key, whether the previous vocabulary admitted it.
    """
    on = np.flatnonzero(today)  # the keys seen today: few, so today's sums only look at them
    weights, today_field = today[on].astype(np.float64), field[on]
    return FieldTotals(
        seen=count_by_field(field, count > 0, n_fields),
        admitted=count_by_field(field, admitted, n_fields),
        evicted=count_by_field(field, evicted, n_fields),
        covered=count_by_field(today_field, admitted[on], n_fields, weights),
        present=count_by_field(today_field, None, n_fields, weights),
        known=count_by_field(today_field, was_admitted[on], n_fields, weights),
        distinct=count_by_field(today_field, None, n_fields),
    )


def count_by_field(
    field: np.ndarray, mask: np.ndarray | None, n_fields: int, weights: np.ndarray | None = None
) -> np.ndarray:
    """Keys (or the sum of `weights`) per field 0..n_fields-1 among `mask` (None: all), int64."""
    if mask is not None:
        field, weights = field[mask], None if weights is None else weights[mask]
    return np.bincount(field, weights=weights, minlength=n_fields)[:n_fields].astype(np.int64)


def stats_from_totals(
    totals: FieldTotals, *, day_rows: int, fields: Sequence[str], multi_valued: Sequence[str] = ()
) -> list[dict]:
    """Per-field summary of a vocabulary for the manifest, the report and the flow's metrics.

    seen: keys with a windowed count > 0; admitted / evicted: key counts;
    coverage: share of the day's rows whose value is admitted; oov_rate: share
    whose non-missing value is not; missing_rate: the rest.  For a
    multi-valued field coverage and oov_rate are shares of the day's values
    (not rows) and missing_rate is None.
    """
    rows = max(day_rows, 1)
    out = []
    for j, name in enumerate(fields):
        covered, present = int(totals.covered[j]), int(totals.present[j])
        if name in multi_valued:
            values = max(present, 1)
            cov, pres, missing = covered / values, 1.0, None
        else:
            cov, pres = covered / rows, present / rows
            missing = round(1.0 - pres, 6)
        out.append(
            {
                "field": name,
                "seen": int(totals.seen[j]),
                "admitted": int(totals.admitted[j]),
                "evicted": int(totals.evicted[j]),
                "coverage": round(cov, 6),
                "oov_rate": round(pres - cov, 6),
                "missing_rate": missing,
            }
        )
    return out


def day_field_stats(
    totals: FieldTotals, *, day_rows: int, fields: Sequence[str], multi_valued: Sequence[str] = ()
) -> list[dict]:
    """Per field, what the day brings against the vocabulary before it (the manifest's `day_fields`).

    day_keys: distinct keys seen today; oov_rate_previous: share of the day's rows (of a multi-valued
    field: of its values) whose non-missing value the previous vocabulary did not admit, which is
    what the model trained through the day before sees as out of vocabulary.
    """
    rows = max(day_rows, 1)
    out = []
    for j, name in enumerate(fields):
        present, known = int(totals.present[j]), int(totals.known[j])
        base = max(present, 1) if name in multi_valued else rows
        out.append(
            {
                "field": name,
                "day_keys": int(totals.distinct[j]),
                "oov_rate_previous": round((present - known) / base, 6),
            }
        )
    return out


def report_markdown(date: str, stats: Sequence[dict], *, window_dates: Sequence[str], config: VocabConfig) -> str:
    """A short markdown summary of a vocabulary (`report.md`) for the flow to publish."""
    admitted = sum(s["admitted"] for s in stats)
    seen = sum(s["seen"] for s in stats)
    evicted = sum(s["evicted"] for s in stats)
    worst = sorted(stats, key=lambda s: s["oov_rate"], reverse=True)[:5]
    lines = [
        f"# Vocabulary {date}",
        "",
        f"Window: {', '.join(window_dates)} (window_days={config.window_days}, decay={config.decay}); "
        f"min_count={config.min_count}"
        + (f", per field {dict(config.min_count_per_field)}" if config.min_count_per_field else "")
        + f"; ttl_days={config.ttl_days}"
        + (f"; max_keys_per_field={config.max_keys_per_field}" if config.max_keys_per_field else ""),
        "",
        f"**{admitted:,}** keys admitted of {seen:,} seen; **{evicted:,}** evicted.",
        "",
        "| field | seen | admitted | evicted | coverage | OOV rate | missing |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        missing = "-" if s["missing_rate"] is None else f"{s['missing_rate']:.2%}"
        lines.append(
            f"| {s['field']} | {s['seen']:,} | {s['admitted']:,} | {s['evicted']:,} | {s['coverage']:.2%} "
            f"| {s['oov_rate']:.2%} | {missing} |"
        )
    lines += ["", "Highest OOV rates: " + ", ".join(f"{s['field']} {s['oov_rate']:.2%}" for s in worst), ""]
    return "\n".join(lines)
