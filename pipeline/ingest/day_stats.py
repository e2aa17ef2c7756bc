"""A day's data statistics, counted while ingest parses it: what the data checks compare between days.

Each ingest task counts its chunks (`chunk_stats`) and the counts add up (`add_stats`) per file and
per day, so the statistics cost no pass over the data of their own.  Plain JSON data (ints and lists),
stored in the events manifest under `stats`:

    rows       events rows counted
    clicks     rows with label 1
    missing    {field: rows where the field is missing}, every dense and categorical field
    dense_hist {dense field: rows per bin of log1p(max(x, 0))}, bins split at `DENSE_EDGES`

Why log1p(max(x, 0)): it is what the model sees (`pipeline.encode.frame`), so a shift the bins show is a
shift of the model's input.  The bins are fixed, the same every day, so histograms of several days
add up and compare bin by bin (the population stability index, `flows.guards.data_checks`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.schema import LogSchema

DENSE_EDGES: tuple[float, ...] = tuple(float(e) for e in np.arange(0.0, 12.01, 0.5))
"""Bin edges on log1p(max(x, 0)): bin 0 holds x <= 0, bin i holds (edge i-1, edge i], the last bin
everything above 12 (x > 1.6e5)."""
_RAW_EDGES = np.expm1(np.asarray(DENSE_EDGES, np.float64)).astype(np.float32)
"""The same edges on the raw values: binning them needs no log per row."""
BINS = len(DENSE_EDGES) + 1


def empty_stats(schema: LogSchema) -> dict[str, Any]:
    """The statistics of no rows (the start of a sum)."""
    return {
        "rows": 0,
        "clicks": 0,
        "missing": dict.fromkeys((*schema.dense, *schema.categorical), 0),
        "dense_hist": {name: [0] * BINS for name in schema.dense},
    }


def chunk_stats(events: pa.Table, schema: LogSchema) -> dict[str, Any]:
    """The statistics of one chunk's events table (columns per `LogSchema.events_schema`)."""
    out = empty_stats(schema)
    out["rows"] = events.num_rows
    if not events.num_rows:
        return out
    out["clicks"] = int(pc.sum(events.column("label")).as_py() or 0)
    for name in schema.categorical:
        col = events.column(name)
        missing = col.null_count
        if name in schema.multi_separator:  # an empty list is missing too
            missing += int(pc.sum(pc.equal(pc.list_value_length(col), 0)).as_py() or 0)
        out["missing"][name] = int(missing)
    for name in schema.dense:
        values = events.column(name).to_numpy()  # float32, NaN where missing
        out["missing"][name] = missing = int(np.isnan(values).sum())
        hist = np.bincount(np.searchsorted(_RAW_EDGES, values), minlength=BINS)
        hist[-1] -= missing  # NaN sorts past every edge
        out["dense_hist"][name] = hist.tolist()
    return out


def add_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The statistics of the rows of `a` and `b` together."""
    return {
        "rows": a["rows"] + b["rows"],
        "clicks": a["clicks"] + b["clicks"],
        "missing": {k: a["missing"].get(k, 0) + b["missing"].get(k, 0) for k in {**a["missing"], **b["missing"]}},
        "dense_hist": {
            k: [
                x + y
                for x, y in zip(a["dense_hist"].get(k, [0] * BINS), b["dense_hist"].get(k, [0] * BINS), strict=True)
            ]
            for k in {**a["dense_hist"], **b["dense_hist"]}
        },
    }
