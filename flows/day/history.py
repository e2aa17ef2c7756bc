"""The last 30 days at a glance: AUC, logloss and wall time by day, as a PNG beside the metrics."""

from __future__ import annotations

import io
from typing import Any

from flows.day.record import DayRecord, Status
from storage.io.layout import Layout

HISTORY_DAYS = 30


def plot_history(records: list[DayRecord]) -> bytes:
    """PNG bytes of AUC (with its 95% interval) and logloss by date (published days as dots, refused as crosses),
    and of each day's wall time with its training part."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (ax_auc, ax_loss, ax_wall) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    dates = [r.date for r in records]
    for ax, key, label in ((ax_auc, "auc", "AUC"), (ax_loss, "logloss", "logloss")):
        values = [getattr(r, key) for r in records]
        ax.plot(dates, [v if v is not None else float("nan") for v in values], color="tab:blue", lw=1)
        for status, marker, color in ((Status.PUBLISHED, "o", "tab:green"), (Status.REFUSED, "x", "tab:red")):
            pts = [
                (d, v) for d, v, r in zip(dates, values, records, strict=True) if r.status == status and v is not None
            ]
            if pts:
                ax.scatter(*zip(*pts, strict=True), marker=marker, color=color, label=status, zorder=3)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    lo, hi = auc_interval(records)
    ax_auc.fill_between(dates, lo, hi, color="tab:blue", alpha=0.15, lw=0, label="95% interval")
    wall = [r.wall_s / 60 for r in records]
    ax_wall.bar(dates, wall, color="tab:gray", label="wall")
    ax_wall.bar(
        dates,
        [min(r.seconds.get("train", 0.0) / 60, w) for r, w in zip(records, wall, strict=True)],
        color="tab:blue",
        label="train",
    )
    ax_wall.set_ylabel("minutes")
    ax_wall.grid(alpha=0.3)
    ax_wall.legend(loc="upper left", fontsize=8)
    if ax_auc.get_legend_handles_labels()[0]:  # days with neither a published nor a refused AUC mark none
        ax_auc.legend(loc="lower right", fontsize=8)
    ax_wall.tick_params(axis="x", rotation=45, labelsize=7)
    fig.suptitle(f"daily retrain: last {len(records)} day(s)")
    return figure_png(fig, dpi=90)


def auc_interval(records: list[DayRecord]) -> tuple[list[float], list[float]]:
    """Each day's AUC +- 1.96 Hanley-McNeil standard errors from its eval positives and negatives (NaN where the
    record has no AUC or no positives: nothing is drawn there)."""
    from flows.guards.noise import hanley_mcneil_se

    lo, hi = [], []
    for r in records:
        pos = getattr(r, "eval_positives", 0) or 0
        se = float(hanley_mcneil_se(r.auc, pos, r.rows_eval - pos)) if r.auc is not None and pos else float("nan")
        lo.append(r.auc - 1.96 * se if r.auc is not None else float("nan"))
        hi.append(r.auc + 1.96 * se if r.auc is not None else float("nan"))
    return lo, hi


def figure_png(fig: Any, *, dpi: int) -> bytes:
    """PNG bytes of a matplotlib figure, which is closed (laid out tight first)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine behind, and savefig lays out a figure that has an engine
    # by drawing it once more, unwritten, before the draw it writes (the same pixels): none is left
    fig.set_layout_engine(None)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()


def write_history_png(layout: Layout, date: str, records: list[DayRecord]) -> str:
    """Write `runs/<model>/date=D/history.png`; returns its URL."""
    fs, path = layout.fs(layout.run_history(date))
    with fs.open(path, "wb") as f:
        f.write(plot_history(records))
    return fs.unstrip_protocol(path)
