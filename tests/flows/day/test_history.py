"""The history chart: a PNG of the last days, drawn without warnings whatever the days' outcomes."""

from __future__ import annotations

import warnings

from flows.day.history import plot_history
from flows.day.record import DayRecord, Status


def _day(date: str, status: Status, auc: float | None) -> DayRecord:
    return DayRecord(
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
