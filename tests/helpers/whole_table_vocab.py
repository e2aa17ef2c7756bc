"""The production vocabulary steps run on one whole table (one bucket), for readable rule tests.

The stage runs the same steps per bucket on Dask; here they run in-process on
small frames, so a test of an admission rule reads as "these day counts, this
previous vocabulary -> this vocabulary".  `window_counts` sums day counts
(`vocab_window_merge.window_table`), `update_vocab` combines them with the
previous vocabulary, applies the cap with the stage's own `CapSearch` over a
single bucket and splits the kept and evicted keys.  Test code only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.config import VocabConfig
from pipeline.encode.keys import MAX_FIELDS
from pipeline.vocab.admission import (
    Columns,
    admission_thresholds,
    previous_state,
    split_vocab,
)
from pipeline.vocab.cap import CapSearch, cap_histograms, cap_mask, score_bits
from pipeline.vocab.counts import counts_frame
from pipeline.vocab.dates import day_number, day_numbers, day_strings
from pipeline.vocab.window_merge import combine, window_table


@dataclass(frozen=True, slots=True)
class VocabUpdate:
    vocab: pd.DataFrame
    """field int16, key int64, count int64 (windowed), score float64 (decayed count), first_seen,
    last_seen (YYYY-MM-DD), admitted bool; sorted by key."""
    evicted: pd.DataFrame
    """field int16, key int64, last_seen: keys admitted before D and dropped by the TTL or the cap."""


def window_counts(day_counts: Mapping[str, pd.DataFrame], *, date: str | None = None, decay: float = 1.0) -> pd.DataFrame:
    """(field, key, count, score, first_date, last_date) of date -> (field, key, count) day counts.

    Args:
        date: the run date the decay counts from (default: the latest date given).
        decay: a day k days before `date` adds decay**k * count to `score`.
    """
    end = day_number(date or max(day_counts)) if day_counts else 0
    days = [(day_number(d), f["key"].to_numpy(np.int64), f["count"].to_numpy(np.int64)) for d, f in day_counts.items()]
    w = window_table(days, end=end, decay=decay)
    out = counts_frame(w["key"], w["count"])
    out["score"] = w["score"]
    out["first_date"] = day_strings(w["first"])
    out["last_date"] = day_strings(w["last"])
    return out


def update_vocab(
    *, date: str, window: pd.DataFrame, previous: pd.DataFrame | None, config: VocabConfig, fields: Sequence[str] = ()
) -> VocabUpdate:
    """The vocabulary of `date` from its `window_counts` and the previous vocabulary (None on the first day).

    Raises:
        ValueError: `config.min_count_per_field` names a field not in `fields`.
    """
    thresholds = admission_thresholds(config, fields)
    if "score" not in window:
        window = window.assign(score=window["count"].astype(np.float64))
    w = {"key": window["key"].to_numpy(np.int64), "count": window["count"].to_numpy(np.int64),
         "score": window["score"].to_numpy(np.float64), "first": day_numbers(window["first_date"]),
         "last": day_numbers(window["last_date"])}
    stored = None if previous is None else pa.Table.from_pandas(previous, preserve_index=False)
    merged = combine(date=day_number(date), window=w, previous=previous_state(stored), thresholds=thresholds,
                     ttl_days=config.ttl_days)
    admitted = merged["admitted"]
    if config.max_keys_per_field:
        admitted = capped(merged, config.max_keys_per_field)
    vocab, evicted = split_vocab(merged, admitted)
    return VocabUpdate(vocab=dated_frame(vocab), evicted=dated_frame(evicted))


def capped(merged: Columns, cap: int) -> np.ndarray:
    """`merged["admitted"]` after the per-field cap, found by `CapSearch` with the whole table as one bucket."""
    field, admitted, bits = merged["field"], merged["admitted"], score_bits(merged["score"])
    search = CapSearch(cap=cap, admitted=np.bincount(field[admitted], minlength=MAX_FIELDS), buckets=1)
    while not search.done:
        search.absorb([cap_histograms(field=field, bits=bits, admitted=admitted, query=search.query(),
                                      shift=search.shift)])
    cuts = {f: (c.bits, c.take[0]) for f, c in search.cuts.items()}
    return cap_mask(field=field, bits=bits, admitted=admitted, cuts=cuts)


def dated_frame(columns: Columns) -> pd.DataFrame:
    """`split_vocab` columns as a frame with YYYY-MM-DD dates."""
    return pd.DataFrame({name: day_strings(v) if name in ("first_seen", "last_seen") else v
                         for name, v in columns.items()})
