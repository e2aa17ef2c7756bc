"""The per-day table a daily run prints (`DayRecord`s): rows, vocabulary, metrics, publish outcome."""

from __future__ import annotations

from typing import Any


def format_table(records: list[Any]) -> str:
    """The per-day summary users read (`DayRecord`s): rows, vocabulary, metrics, publish outcome."""
    from flows.day.record import Status

    shown = {Status.PUBLISHED: "yes", Status.REFUSED: "REFUSED", Status.CHECK_FAILED: "STOPPED"}
    head = ("date", "ingested", "quarant.", "vocab", "train", "eval", "AUC", "logloss", "published", "version")
    rows = [head] + [
        (
            r.date,
            str(r.rows_ingested),
            str(r.rows_quarantined),
            str(r.vocab_size),
            str(r.rows_train),
            str(r.rows_eval),
            "-" if r.auc is None else f"{r.auc:.4f}",
            "-" if r.logloss is None else f"{r.logloss:.4f}",
            shown.get(r.status, r.status),
            str(r.model_version or "-"),
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    refused = [f"  {r.date}: {r.status}: {r.reason}" for r in records if r.status != Status.PUBLISHED]
    return out + ("\n" + "\n".join(refused) if refused else "")
