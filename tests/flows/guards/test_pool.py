"""Which earlier eval rows the gate pools: those neither the candidate nor the published model trained on.

A day's own eval rows are never trained on that day; the next day trains on its parent's first (its record's
`train.parent_eval.date`).  So a date's rows are pooled unless some run carried them, and only from days that
completed (published or refused); a date whose rows lack a column either model reads is left out, and said so.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from flows.guards.pool import PastDay, poolable, unseen_dates


def test_the_published_models_own_day_is_pooled_unless_the_candidate_trained_on_it():
    before = [PastDay("2026-01-01", "published", None)]
    assert unseen_dates("2026-01-02", before, carried=None) == ["2026-01-02", "2026-01-01"]
    assert unseen_dates("2026-01-02", before, carried="2026-01-01") == ["2026-01-02"]


def test_refused_days_are_pooled_and_the_days_runs_carried_are_not():
    before = [
        PastDay("2026-01-01", "published", "2025-12-31"),  # its parent's day: carried, and before the window
        PastDay("2026-01-02", "published", "2026-01-01"),  # LATEST; carried 01-01's rows
        PastDay("2026-01-03", "refused", "2026-01-02"),
        PastDay("2026-01-04", "check_failed", None),  # stopped by a data check: not trusted
        PastDay("2026-01-05", "failed", None),
        PastDay("2026-01-06", "refused", "2026-01-02"),
    ]
    assert unseen_dates("2026-01-07", before, carried="2026-01-02") == ["2026-01-07", "2026-01-06", "2026-01-03"]


def test_a_date_whose_rows_lack_what_a_model_reads_is_left_out_and_said_so(tmp_path: Path):
    for date, columns in (("a", ["label", "k_0", "r_0"]), ("b", ["label", "k_0"])):
        (tmp_path / date).mkdir()
        pd.DataFrame({c: [1] for c in columns}).to_parquet(tmp_path / date / "part-00000.parquet")
    urls = {d: str(tmp_path / d) for d in ("a", "b", "c")}
    kept, left_out = poolable(urls, ["label", "k_0", "r_0"], None)
    assert kept == ["a"] and left_out == {"b": "no r_0", "c": "no eval rows"}
