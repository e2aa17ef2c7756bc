"""`runs/<model>/date=D/checks.png`: the checked series over the window, the day marked by its outcome."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flows.day.history import figure_png
from flows.guards.data_checks import CheckReport
from storage.io.layout import Layout

SERIES = (
    ("rows read", "volume", lambda s: s["rows_read"]),
    ("click rate", "click_rate", lambda s: s["click_rate"]),
    ("padded-row share", "padded_rows", lambda s: s["padded_share"]),
    ("duplicate share", "duplicates", lambda s: s["duplicate_share"]),
    ("largest missing share", "missing_rate", lambda s: max(s["missing"].values(), default=0.0)),
    ("largest OOV share (previous vocab)", "oov_rate", lambda s: max(s["oov"].values(), default=0.0)),
)
"""(title, check, value of a day's `data_stats`)."""
_COLORS = {"pass": "tab:green", "warn": "tab:orange", "fail": "tab:red"}


def plot_checks(
    date: str, today: dict[str, Any], window: Sequence[tuple[str, dict[str, Any]]], report: CheckReport
) -> bytes:
    """PNG bytes: one panel per series, the window's days as a line, the day as a dot coloured by its check."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    status = {r.name: r.status for r in report.results}
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.5))
    days = [d for d, _ in window] + [date]
    for ax, (title, check, value) in zip(axes.ravel(), SERIES, strict=True):
        values = [value(s) for _, s in window] + [value(today)]
        ax.plot(days, values, color="tab:blue", lw=1, marker=".")
        ax.scatter(
            [date],
            [values[-1]],
            s=60,
            zorder=3,
            color=_COLORS.get(status.get(check, ""), "tab:gray"),
            label=status.get(check, "not run"),
        )
        ax.set_title(title, fontsize=9)
        ax.legend(loc="best", fontsize=7)
        ax.tick_params(axis="x", rotation=45, labelsize=6)
        ax.grid(alpha=0.3)
    fig.suptitle(f"data checks of {date} against {len(window)} completed day(s) before it")
    return figure_png(fig, dpi=80)


def write_checks_png(
    layout: Layout, date: str, today: dict[str, Any], window: Sequence[tuple[str, dict[str, Any]]], report: CheckReport
) -> str:
    """Write `checks.png` of the day's run; returns its URL."""
    fs, path = layout.fs(layout.run_checks_chart(date))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(plot_checks(date, today, window, report))
    return fs.unstrip_protocol(path)
