"""Tiny day counts for the vocabulary rule tests, and `update_bucket` on them as frames.

Field-0 values are named by keyword; `update_vocab` runs the stage's own
per-bucket rule (`pipeline.vocab.bucket.update_bucket`) with one bucket
holding every key, only converting frames to arrays and back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from pipeline.config import VocabConfig
from pipeline.encode.keys import feature_keys
from pipeline.vocab.admission import Columns, previous_state
from pipeline.vocab.bucket import BucketRule, update_bucket
from pipeline.vocab.counts import count_keys, counts_frame
from pipeline.vocab.dates import day_number, day_strings
from pipeline.vocab.window_merge import window_table


def counts(**key_count: int) -> pd.DataFrame:
    """Day counts of field-0 values named by the keyword, e.g. counts(a=2, b=1)."""
    frame = pd.DataFrame({"v": [k for k, n in key_count.items() for _ in range(n)]})
    return count_keys(frame, ["v"])


def key(value: str, field: int = 0) -> int:
    """The key of `value` in field `field`."""
    return int(feature_keys(field, [value])[0])


@dataclass(frozen=True, slots=True)
class VocabUpdate:
    """`update_bucket`'s result as frames with YYYY-MM-DD dates (what the rule tests read)."""

    vocab: pd.DataFrame
    """field, key, count, score, first_seen, last_seen, admitted; sorted by key."""
    evicted: pd.DataFrame
    """field, key, last_seen: keys admitted before D and dropped by the TTL or the cap."""


def update_vocab(
    *,
    date: str,
    days: Mapping[str, pd.DataFrame],
    previous: pd.DataFrame | None,
    config: VocabConfig,
    fields: Sequence[str] = (),
) -> VocabUpdate:
    """The vocabulary of `date` by `update_bucket`, with one bucket holding every key (the window merge).

    Args:
        days: date -> (field, key, count) day counts of the window (`counts`), `date` included if seen.
        previous: the previous `update_vocab(...).vocab` (None on the first day).
    """

    def arrays(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        frame = frame.sort_values("key")
        return frame["key"].to_numpy(np.int64), frame["count"].to_numpy(np.int64)

    empty = pd.DataFrame({"key": np.empty(0, np.int64), "count": np.empty(0, np.int64)})
    stored = None if previous is None else pa.Table.from_pandas(previous, preserve_index=False)
    out = update_bucket(
        date=day_number(date),
        today=arrays(days.get(date, empty)),
        previous=previous_state(stored),
        rule=BucketRule.of(config, fields),
        window=[(day_number(d), *arrays(f)) for d, f in days.items() if d != date],
    )
    return VocabUpdate(vocab=dated_frame(out.vocab), evicted=dated_frame(out.evicted))


def window_counts(
    day_counts: Mapping[str, pd.DataFrame], *, date: str | None = None, decay: float = 1.0
) -> pd.DataFrame:
    """`window_table` of date -> day counts as a frame: field, key, count, score, first_date, last_date.

    Args:
        date: the run date the decay counts from (default: the latest date given).
    """
    end = day_number(date or max(day_counts)) if day_counts else 0
    days = [(day_number(d), f["key"].to_numpy(np.int64), f["count"].to_numpy(np.int64)) for d, f in day_counts.items()]
    w = window_table(days, end=end, decay=decay)
    out = counts_frame(w["key"], w["count"])
    out["score"] = w["score"]
    out["first_date"] = day_strings(w["first"])
    out["last_date"] = day_strings(w["last"])
    return out


def dated_frame(columns: Columns) -> pd.DataFrame:
    """Columns with day-number dates as a frame with YYYY-MM-DD dates."""
    return pd.DataFrame(
        {name: day_strings(v) if name in ("first_seen", "last_seen") else v for name, v in columns.items()}
    )
