"""The data checks between ingest and training: the day's statistics against the trailing window's.

Pure: `data_stats` turns what ingest, vocab and encode counted (their manifests) into the day's
checked series, `run_checks` compares them with the series of the completed days before it, in the
manner of TFDV's statistics comparison.  The stage (`flows.day.stages.checks`) reads the window from the
days' records, where each day's series is kept (`DayRecord.data_stats`).

Absolute checks run on every day: padded rows, a click rate of 0 or 1 (AUC is undefined), duplicates, and
leakage (a feature that separates the labels, `flows.guards.leakage`, found on the day's rows by the stage).
The others compare with the window's median and need at least 2 completed days in it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flows.guards.check_config import CHECKS, ChecksConfig

MIN_WINDOW = 2
"""Completed days in the window the relative checks need."""
_PSI_FLOOR = 1e-4
"""Share given to an empty bin, so that the index stays finite."""


def data_stats(
    *,
    rows_read: int,
    rows_quarantined: int,
    rows_padded: int,
    ingest_stats: dict[str, Any],
    day_fields: Sequence[dict],
    duplicate_share: float,
) -> dict[str, Any]:
    """The day's checked series (JSON data) from the ingest manifest's counts, the vocabulary's
    `day_fields` and encode's duplicate share."""
    rows = ingest_stats["rows"]
    return {
        "rows_read": rows_read,
        "quarantined_share": rows_quarantined / rows_read if rows_read else 0.0,
        "padded_share": rows_padded / rows if rows else 0.0,
        "click_rate": ingest_stats["clicks"] / rows if rows else 0.0,
        "duplicate_share": duplicate_share,
        "missing": {k: (v / rows if rows else 1.0) for k, v in ingest_stats["missing"].items()},
        "oov": {f["field"]: f["oov_rate_previous"] for f in day_fields},
        "distinct": {f["field"]: f["day_keys"] for f in day_fields},
        "dense_hist": ingest_stats["dense_hist"],
    }


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of the day: `{name, status: pass|warn|fail, value, threshold, detail}` in the record."""

    name: str
    status: str
    value: float | None
    threshold: float | list[float] | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class CheckReport:
    results: tuple[CheckResult, ...]
    window: tuple[str, ...]
    """The completed days compared with."""
    note: str
    """Which checks did not run, and why (empty when all ran)."""

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    @property
    def warned(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "warn"]

    def reason(self) -> str:
        """The failed checks in one line (the record's reason)."""
        return "data checks failed: " + "; ".join(f"{r.name}: {r.detail}" for r in self.failed)


def run_checks(
    today: dict[str, Any],
    window: Sequence[tuple[str, dict[str, Any]]],
    cfg: ChecksConfig,
    *,
    leakage: tuple[bool, float | None, Any, str] | None = None,
) -> CheckReport:
    """Every check that is not `off`, in `CHECKS` order; relative ones only with `MIN_WINDOW` days.  `leakage`: what
    `flows.guards.leakage.label_separation` found on the day's rows (None: not looked at)."""
    past = [stats for _, stats in window]
    relative = len(past) >= MIN_WINDOW
    found: dict[str, tuple[bool, float | None, Any, str]] = {}  # name -> (violated, value, threshold, detail)
    found["padded_rows"] = _at_most(today["padded_share"], cfg.max_padded_share, "of rows have missing trailing fields")
    found["duplicates"] = _at_most(today["duplicate_share"], cfg.max_duplicate_share, "of rows copy another row")
    if leakage is not None:
        found["leakage"] = leakage
    ctr = today["click_rate"]
    if ctr in (0.0, 1.0):
        found["click_rate"] = (
            True,
            ctr,
            [0.0, 1.0],
            f"click rate is {ctr:g}: every label is {int(ctr)}, AUC is undefined",
        )
    if relative:
        found["volume"] = _volume(today, past, cfg)
        found.setdefault("click_rate", _ctr_change(ctr, past, cfg))
        found["missing_rate"] = _worst_rise(
            today["missing"], [p["missing"] for p in past], cfg.max_missing_increase, "missing share"
        )
        found["quarantined"] = _rise(
            today["quarantined_share"],
            [p["quarantined_share"] for p in past],
            cfg.max_quarantined_increase,
            "quarantined share",
        )
        found["psi"] = _psi_check(today["dense_hist"], [p["dense_hist"] for p in past], cfg.max_psi)
        found["oov_rate"] = _worst_rise(
            today["oov"],
            [p["oov"] for p in past],
            cfg.max_oov_increase,
            "share of values new to the previous vocabulary",
        )
        found["distinct_keys"] = _distinct(today["distinct"], [p["distinct"] for p in past], cfg)
    results = []
    for name in CHECKS:
        action = cfg.action(name)
        if action == "off" or name not in found:
            continue
        violated, value, threshold, detail = found[name]
        results.append(CheckResult(name, action if violated else "pass", value, threshold, detail))
    off = [n for n in CHECKS if cfg.action(n) == "off"]
    notes = []
    if not relative:
        notes.append(
            f"only the absolute checks ran: {len(past)} completed day(s) in the {cfg.window_days} days "
            f"before, the others need {MIN_WINDOW}"
        )
    if off:
        notes.append(f"off: {', '.join(off)}")
    return CheckReport(tuple(results), tuple(d for d, _ in window), "; ".join(notes))


def psi(today: Sequence[int], baseline: Sequence[int]) -> float:
    """Population stability index of two histograms on the same bins: sum (p - q) ln(p / q)."""
    n, m = sum(today), sum(baseline)
    if not n or not m:
        return 0.0
    out = 0.0
    for a, b in zip(today, baseline, strict=True):
        p, q = max(a / n, _PSI_FLOOR), max(b / m, _PSI_FLOOR)
        out += (p - q) * math.log(p / q)
    return out


# ---- the checks: each returns (violated, value, threshold, detail) ----------------------------------
def _at_most(value: float, limit: float, what: str) -> tuple[bool, float, float, str]:
    return value > limit, value, limit, f"{value:.2%} {what} (limit {limit:.2%})"


def _volume(today: dict, past: list[dict], cfg: ChecksConfig) -> tuple[bool, float, list[float], str]:
    median = statistics.median(p["rows_read"] for p in past)
    ratio = today["rows_read"] / median if median else math.inf
    bounds = [cfg.min_volume_ratio, cfg.max_volume_ratio]
    return (
        not bounds[0] <= ratio <= bounds[1],
        ratio,
        bounds,
        f"{today['rows_read']} rows read, {ratio:.2f}x the window's median {median:g}"
        f" (allowed {bounds[0]}x..{bounds[1]}x)",
    )


def _ctr_change(ctr: float, past: list[dict], cfg: ChecksConfig) -> tuple[bool, float, float, str]:
    median = statistics.median(p["click_rate"] for p in past)
    change = abs(ctr - median) / median if median else math.inf
    return (
        change > cfg.max_ctr_change,
        change,
        cfg.max_ctr_change,
        f"click rate {ctr:.4f} vs the window's median {median:.4f}: {change:.0%} change"
        f" (limit {cfg.max_ctr_change:.0%})",
    )


def _rise(value: float, past: list[float], limit: float, what: str) -> tuple[bool, float, float, str]:
    median = statistics.median(past)
    rise = value - median
    return rise > limit, rise, limit, f"{what} {value:.2%} vs the window's median {median:.2%} (limit +{limit:.2%})"


def _worst_rise(
    today: dict[str, float], past: list[dict[str, float]], limit: float, what: str
) -> tuple[bool, float, float, str]:
    rises = {k: v - statistics.median(p.get(k, v) for p in past) for k, v in today.items()}
    if not rises:
        return False, 0.0, limit, "no fields"
    over = sorted((k for k, r in rises.items() if r > limit), key=lambda k: -rises[k])
    worst = max(rises, key=lambda k: rises[k])
    if over:
        return (
            True,
            rises[worst],
            limit,
            f"{what} rose by more than {limit:.0%} in {', '.join(over)} "
            f"({worst}: {today[worst]:.2%}, {rises[worst]:+.2%})",
        )
    return False, rises[worst], limit, f"largest rise of the {what}: {worst} {rises[worst]:+.2%} (limit +{limit:.0%})"


def _psi_check(
    today: dict[str, list[int]], past: list[dict[str, list[int]]], limit: float
) -> tuple[bool, float, float, str]:
    values = {}
    for name, hist in today.items():
        baseline = [sum(b) for b in zip(*(p[name] for p in past if name in p), strict=True)] if past else []
        if baseline:
            values[name] = psi(hist, baseline)
    if not values:
        return False, 0.0, limit, "no dense fields"
    worst = max(values, key=lambda k: values[k])
    over = [k for k, v in values.items() if v > limit]
    if over:
        return True, values[worst], limit, f"PSI over {limit} in {', '.join(over)} (worst {worst}: {values[worst]:.3f})"
    return False, values[worst], limit, f"largest PSI: {worst} {values[worst]:.3f} (limit {limit})"


def _distinct(
    today: dict[str, int], past: list[dict[str, int]], cfg: ChecksConfig
) -> tuple[bool, float, list[float], str]:
    bounds = [cfg.min_volume_ratio, cfg.max_volume_ratio]
    ratios = {}
    for k, v in today.items():
        median = statistics.median(p.get(k, 0) for p in past)
        if median:
            ratios[k] = v / median
    if not ratios:
        return False, 1.0, bounds, "no fields"
    worst = max(ratios, key=lambda k: max(ratios[k], 1 / ratios[k] if ratios[k] else math.inf))
    over = [k for k, r in ratios.items() if not bounds[0] <= r <= bounds[1]]
    detail = (
        f"distinct keys of the day vs the window's median: {worst} {ratios[worst]:.2f}x"
        f" (allowed {bounds[0]}x..{bounds[1]}x)"
    )
    return bool(over), ratios[worst], bounds, (f"outside in {', '.join(over)}; " if over else "") + detail
