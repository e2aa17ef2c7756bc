"""The day as a Prefect markdown artifact: its stage results, the last days, the checks and the charts.

Keyed by model, root digest and date (`artifact_key`), so two roots of one model on one server keep their own.
"""

from __future__ import annotations

import base64
from typing import Any

from prefect.artifacts import create_markdown_artifact

from flows.config import RunConfig
from flows.day.history import HISTORY_DAYS
from flows.day.record import DayRecord, recent_records
from flows.prefect.keys import model_key

MAX_INLINE_IMAGE_BYTES = 150_000
"""A chart up to this size is embedded in the artifact (a `data:` URI the UI shows); a larger one is named."""


def artifact_key(cfg: RunConfig, date: str) -> str:
    """`daily-retrain-<model>-<root digest>-<date>`: two roots of one model on one server keep their own."""
    return f"daily-retrain-{model_key(cfg.layout())}-{date}".lower().replace("_", "-").replace(".", "-")


def day_markdown(cfg: RunConfig, r: DayRecord, *, latest: str | None, digest: str) -> str:
    """The day as markdown: its stage results, the last days' AUC (a table the UI shows), the checks, the charts.

    Args:
        latest: the version LATEST names now (a stopped or failed day's record does not know it).
        digest: the run's config digest (`flows.prefect.keys.config_digest`).
    """

    def f4(v: float | None) -> str:
        return "none" if v is None else f"{v:.4f}"

    layout = cfg.layout()
    rows = [
        ("rows read / ingested / quarantined", f"{r.rows_read} / {r.rows_ingested} / {r.rows_quarantined}"),
        ("vocabulary (admitted keys)", f"{r.vocab_size}"),
        ("train / eval rows", f"{r.rows_train} / {r.rows_eval}"),
        ("AUC / logloss", f"{f4(r.auc)} / {f4(r.logloss)}"),
        ("published model AUC on the same eval rows", f4(r.published_auc)),
        ("next-day AUC of the published model (a sample of today's train rows)", _next_day(r)),
        ("outcome", f"{r.status}: {r.reason}"),
        ("model version", f"{r.model_version or 'none'} (LATEST = {latest or 'none'})"),
        ("wall time (of which training)", f"{r.wall_s:.1f} s ({r.seconds.get('train', 0.0):.1f} s)"),
        ("model and root", f"{cfg.model_name} on {cfg.root} (`{model_key(layout)}`)"),
        ("config digest", f"`{digest}` (a deployment's config is frozen at `ctrpipe deploy`)"),
    ]
    table = "\n".join(f"| {k} | {_cell(v)} |" for k, v in rows)
    history = [h for h in recent_records(layout, r.date, HISTORY_DAYS) if h.date != r.date] + [r]
    days = "\n".join(
        f"| {h.date} | {h.status} | {f4(h.auc)} | {f4(h.logloss)} | {h.model_version or '-'} |" for h in history
    )
    charts = "\n\n".join(
        _image(layout, url, title)
        for url, title in (
            (layout.run_history(r.date), f"AUC and logloss over the last {HISTORY_DAYS} days"),
            (layout.run_checks_chart(r.date), "the checked data series"),
        )
    )
    return (
        f"# Daily retrain of {cfg.model_name}, {r.date}\n\n| stage result | value |\n|---|---|\n{table}\n\n"
        f"## The last {len(history)} day(s)\n\n| date | outcome | AUC | logloss | version |\n|---|---|---|---|---|\n"
        f"{days}\n\n{checks_markdown(r)}\n\n{charts}\n"
    )


def _cell(v: str) -> str:
    return v.replace("|", "\\|").replace("\n", " ")


def _image(layout: Any, url: str, title: str) -> str:
    """The chart embedded as a `data:` URI when it exists and is small, else its path."""
    fs, path = layout.fs(url)
    try:
        size = fs.size(path)
        if size and size <= MAX_INLINE_IMAGE_BYTES:
            data = base64.b64encode(fs.cat_file(path)).decode()
            return f"![{title}](data:image/png;base64,{data})"
    except FileNotFoundError:
        return f"{title}: not drawn"
    return f"{title}: `{url}`"


def write_artifact(cfg: RunConfig, r: DayRecord, *, latest: str | None, digest: str) -> None:
    """The day's markdown (`day_markdown`) as an artifact, shown in the Prefect UI."""
    create_markdown_artifact(
        key=artifact_key(cfg, r.date),
        markdown=day_markdown(cfg, r, latest=latest, digest=digest),
        description=f"Daily retrain of {cfg.model_name} on {cfg.root}, {r.date}: {r.status}",
    )


def checks_markdown(r: DayRecord) -> str:
    """The data checks and the publish gate's checks of a record as markdown tables."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    lines = [
        f"## Data checks ({r.checks_note or f'against {len(r.checks_window)} completed day(s)'})",
        "",
        "| check | status | value | threshold | detail |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {c['name']} | {c['status']} | {cell(c['value'])} | {cell(c['threshold'])} | {c['detail']} |"
        for c in r.checks
    ]
    if r.gate:
        lines += ["", "## Publish gate", "", "| check | passed | value | threshold | detail |", "|---|---|---|---|---|"]
        lines += [
            f"| {c['name']} | {'yes' if c['passed'] else 'undecided' if c.get('undecided') else 'NO'} "
            f"| {cell(c['value'])} | {cell(c['threshold'])} "
            f"| {c['detail']} |"
            for c in r.gate
        ]
    return "\n".join(lines)


def _next_day(r: DayRecord) -> str:
    nd = r.evaluate.get("next_day")
    if not nd:
        return "none"
    lo, hi = nd["auc_ci95"]
    return f"{nd['auc']:.4f} [{lo:.4f}, {hi:.4f}] on {nd['rows']} of {nd['of_rows']} rows"
