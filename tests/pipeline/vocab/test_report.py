"""Vocabulary reports: per-field sums that buckets add up, shares of the day's rows, the markdown summary."""

import numpy as np

from pipeline.config import VocabConfig
from pipeline.vocab.report import (
    FieldTotals,
    day_field_stats,
    field_totals,
    report_markdown,
    stats_from_totals,
)


def test_field_totals_of_buckets_add_up_to_those_of_the_whole_table():
    keys = {
        "field": np.array([0, 0, 1, 1, 1, 0]),
        "count": np.array([2, 0, 1, 3, 0, 1]),
        "admitted": np.array([True, True, False, True, True, False]),
        "evicted": np.array([False, False, True, False, False, True]),
        "today": np.array([1, 0, 0, 2, 0, 1]),
        "was_admitted": np.array([False, True, True, True, False, False]),
    }
    whole = field_totals(**keys, n_fields=3)
    halves = field_totals(**{k: v[:3] for k, v in keys.items()}, n_fields=3) + field_totals(
        **{k: v[3:] for k, v in keys.items()}, n_fields=3
    )
    want = {
        "seen": [2, 2, 0],
        "admitted": [2, 2, 0],
        "evicted": [1, 1, 0],
        "covered": [1, 2, 0],
        "present": [2, 2, 0],
        "known": [0, 2, 0],
        "distinct": [2, 1, 0],
    }
    for name, values in want.items():
        assert getattr(whole, name).tolist() == values and getattr(halves, name).tolist() == values, name
    assert FieldTotals.zeros(3).seen.tolist() == [0, 0, 0]


def test_shares_are_of_the_days_rows_or_of_a_multi_valued_fields_values():
    totals = FieldTotals(
        seen=np.array([5, 3]),
        admitted=np.array([2, 1]),
        evicted=np.array([1, 0]),
        covered=np.array([6, 4]),
        present=np.array([8, 10]),
        known=np.array([5, 4]),
        distinct=np.array([4, 3]),
    )
    stats = stats_from_totals(totals, day_rows=10, fields=["A", "tags"], multi_valued=["tags"])
    assert stats == [
        {"field": "A", "seen": 5, "admitted": 2, "evicted": 1, "coverage": 0.6, "oov_rate": 0.2, "missing_rate": 0.2},
        {
            "field": "tags",
            "seen": 3,
            "admitted": 1,
            "evicted": 0,
            "coverage": 0.4,
            "oov_rate": 0.6,
            "missing_rate": None,
        },
    ]


def test_the_days_new_values_are_shares_against_the_previous_vocabulary():
    totals = FieldTotals(
        seen=np.array([5, 3]),
        admitted=np.array([2, 1]),
        evicted=np.array([1, 0]),
        covered=np.array([6, 4]),
        present=np.array([8, 10]),
        known=np.array([5, 4]),
        distinct=np.array([4, 3]),
    )
    stats = day_field_stats(totals, day_rows=10, fields=["A", "tags"], multi_valued=["tags"])
    assert stats == [
        {"field": "A", "day_keys": 4, "oov_rate_previous": 0.3},  # (8 - 5) of 10 rows
        {"field": "tags", "day_keys": 3, "oov_rate_previous": 0.6},
    ]  # (10 - 4) of 10 values


def test_the_markdown_report_names_the_config_the_totals_and_the_worst_fields():
    stats = [
        {
            "field": "A",
            "seen": 1000,
            "admitted": 20,
            "evicted": 3,
            "coverage": 0.5,
            "oov_rate": 0.1,
            "missing_rate": 0.4,
        },
        {
            "field": "tags",
            "seen": 7,
            "admitted": 5,
            "evicted": 0,
            "coverage": 0.75,
            "oov_rate": 0.25,
            "missing_rate": None,
        },
    ]
    md = report_markdown(
        "2026-01-02",
        stats,
        window_dates=["2026-01-01", "2026-01-02"],
        config=VocabConfig(window_days=2, min_count=3, max_keys_per_field=50),
    )
    lines = md.splitlines()
    assert lines[0] == "# Vocabulary 2026-01-02"
    assert "window_days=2" in lines[2] and "min_count=3" in lines[2] and "max_keys_per_field=50" in lines[2]
    assert "**25** keys admitted of 1,007 seen; **3** evicted." in md
    assert "| A | 1,000 | 20 | 3 | 50.00% | 10.00% | 40.00% |" in lines
    assert "| tags | 7 | 5 | 0 | 75.00% | 25.00% | - |" in lines
    assert "Highest OOV rates: tags 25.00%, A 10.00%" in md
