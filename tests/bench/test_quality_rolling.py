"""bench.quality --protocol rolling: every shared real row cut into days by row order, each origin trained
through the product path on the days before it and scored on the next; pooled AUCs with paired sds and the
peers (or a line saying why a peer is skipped)."""

from __future__ import annotations

import pytest

from bench.quality_rolling import split_counts


def test_a_sample_is_cut_into_consecutive_days_of_almost_equal_size() -> None:
    assert split_counts(10_000, 5) == (2_000,) * 5
    assert split_counts(9_999, 5) == (1_999, 2_000, 2_000, 2_000, 2_000)
    assert sum(split_counts(3_301, 3)) == 3_301
    with pytest.raises(ValueError, match="rolling split"):
        split_counts(10, 1)


# Its smoke run (every origin pooled, every model on the same rows): tests/bench/test_smoke.py::check_quality.
