"""The history chart: a PNG of the last days, drawn without warnings whatever the days' outcomes."""

from __future__ import annotations

import math
import warnings

import pytest

from flows.cli.table import where_line
from flows.day.history import auc_interval, plot_history
from flows.day.record import DayRecord, Status
from flows.guards.noise import hanley_mcneil_se
from storage.io.layout import Layout


def _day(date: str, status: Status, auc: float | None, rows: int = 0, positives: int = 0) -> DayRecord:
    return DayRecord(
        rows_eval=rows,
        eval_positives=positives,
        date=date,
        completed=True,
        status=status,
        reason="",
        auc=auc,
        logloss=None if auc is None else 0.45,
        seconds={"train": 30.0},
        wall_s=60.0,
    )


def test_days_stopped_before_training_draw_without_a_legend_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels" would fail here
        png = plot_history([_day("2026-01-01", Status.CHECK_FAILED, None)])
    assert png.startswith(b"\x89PNG")


def test_published_and_refused_days_draw_a_chart() -> None:
    png = plot_history([_day("2026-01-01", Status.PUBLISHED, 0.74), _day("2026-01-02", Status.REFUSED, 0.70)])
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_the_auc_band_is_each_days_95_percent_interval_from_its_eval_positives() -> None:
    days = [_day("2026-01-01", Status.PUBLISHED, 0.74, 3000, 600), _day("2026-01-02", Status.REFUSED, 0.70, 300, 6)]
    lo, hi = auc_interval(days + [_day("2026-01-03", Status.PUBLISHED, 0.71), _day("2026-01-04", Status.FAILED, None)])
    for k, (auc, pos, rows) in enumerate(((0.74, 600, 3000), (0.70, 6, 300))):
        se = float(hanley_mcneil_se(auc, pos, rows - pos))
        assert (lo[k], hi[k]) == pytest.approx((auc - 1.96 * se, auc + 1.96 * se))
    assert hi[1] - lo[1] > 5 * (hi[0] - lo[0])  # 6 positives say far less than 600
    assert all(math.isnan(v) for v in lo[2:] + hi[2:])  # a record without positives (older) or without an AUC
    assert plot_history(days).startswith(b"\x89PNG")


def test_the_run_says_where_the_days_reports_are(tmp_path) -> None:
    layout = Layout(str(tmp_path / "root"), "ctr")
    assert where_line(layout, "2026-01-01") == ""  # nothing written: nothing named
    for url in (f"{layout.vocab('2026-01-01')}/report.md", layout.run_history("2026-01-01")):
        fs, path = layout.fs(url)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe(path, b"x")
    line = where_line(layout, "2026-01-01")
    assert line.startswith("2026-01-01: per-field report ") and line.endswith("/history.png")
    assert "report.md; AUC over days " in line and "checks chart" not in line
