"""The per-day table a daily run prints (`DayRecord`s): rows, vocabulary, metrics, publish outcome.

`pos.` is the eval positives the AUC was computed from.  `published` is `yes`, `REFUSED`, `UNDECIDED` (the gate
could not decide and kept LATEST: `publish.on_undecided`), `yes, undecided` or `STOPPED` (a data check)."""

from __future__ import annotations

from typing import Any


def format_table(records: list[Any]) -> str:
    """The per-day summary users read (`DayRecord`s): rows, vocabulary, metrics, publish outcome."""
    from flows.day.record import Status

    shown = {Status.PUBLISHED: "yes", Status.REFUSED: "REFUSED", Status.CHECK_FAILED: "STOPPED"}
    head = ("date", "ingested", "quarant.", "vocab", "train", "eval", "pos.", "AUC", "logloss", "published", "version")
    rows = [head] + [
        (
            r.date,
            str(r.rows_ingested),
            str(r.rows_quarantined),
            str(r.vocab_size),
            str(r.rows_train),
            str(r.rows_eval),
            str(r.eval_positives) if r.auc is not None else "-",
            "-" if r.auc is None else f"{r.auc:.4f}",
            "-" if r.logloss is None else f"{r.logloss:.4f}",
            _outcome(r, shown),
            str(r.model_version or "-"),
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    notes = [f"  {r.date}: {r.status}: {r.reason}" for r in records if r.status != Status.PUBLISHED or _undecided(r)]
    return out + ("\n" + "\n".join(notes) if notes else "")


def _undecided(r: Any) -> bool:
    return str(getattr(r, "gate_verdict", "")).startswith("undecided")


def _outcome(r: Any, shown: dict[Any, str]) -> str:
    if _undecided(r):
        return "yes, undecided" if r.published else "UNDECIDED"
    return shown.get(r.status, r.status)


def where_line(layout: Any, date: str) -> str:
    """Where a day's reports are: the vocabulary's per-field report, the checks' and the AUC-over-days charts (those
    the day wrote; empty when none)."""
    from storage.io import fsio

    files = (
        ("per-field report", fsio.join(layout.vocab(date), "report.md")),
        ("checks chart", layout.run_checks_chart(date)),
        ("AUC over days", layout.run_history(date)),
    )
    found = []
    for what, url in files:
        fs, path = layout.fs(url)
        if fs.exists(path):
            found.append(f"{what} {url}")
    return f"{date}: " + "; ".join(found) if found else ""
