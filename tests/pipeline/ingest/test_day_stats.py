"""Day statistics counted during ingest: labels, missing values, dense histograms; chunks add up."""

import numpy as np

from pipeline.ingest.day_stats import (
    BINS,
    DENSE_EDGES,
    add_stats,
    chunk_stats,
    empty_stats,
)
from pipeline.ingest.parse import parse_table
from pipeline.schema import CRITEO


def _table(lines: list[str]):
    return parse_table("\n".join(lines).encode(), schema=CRITEO, file="t").events


def _line(label="1", i1="3", c1="a", tail=True):
    fields = [label, i1, *["0"] * 12, c1, *["x"] * 25]
    return "\t".join(fields if tail else fields[:20])


def test_labels_missing_values_and_histograms_are_counted():
    t = _table([_line(), _line(label="0", i1=""), _line(i1="-5", c1=""), _line(i1="200000")])
    s = chunk_stats(t, CRITEO)
    assert (s["rows"], s["clicks"]) == (4, 3)
    assert s["missing"]["I1"] == 1 and s["missing"]["C1"] == 1 and s["missing"]["C2"] == 0
    hist = s["dense_hist"]["I1"]
    assert len(hist) == BINS and sum(hist) == 3  # the missing value is in no bin
    assert hist[0] == 1  # x <= 0
    assert hist[int(np.searchsorted(DENSE_EDGES, np.log1p(3)))] == 1 and hist[-1] == 1  # log1p(2e5) > 12


def test_chunks_add_up_to_the_whole():
    lines = [_line(i1=str(i), label=str(i % 2)) for i in range(50)]
    whole = chunk_stats(_table(lines), CRITEO)
    parts = add_stats(
        add_stats(empty_stats(CRITEO), chunk_stats(_table(lines[:20]), CRITEO)), chunk_stats(_table(lines[20:]), CRITEO)
    )
    assert parts == whole


def test_rows_cut_short_are_counted_as_padded():
    parsed = parse_table("\n".join([_line(), _line(tail=False), _line(tail=False)]).encode(), schema=CRITEO, file="t")
    assert parsed.rows_padded == 2 and parsed.quarantine.num_rows == 0 and parsed.events.num_rows == 3
    assert parse_table(_line().encode(), schema=CRITEO, file="t").rows_padded == 0
