"""Feature vocabulary logic (pure pandas/NumPy): counting, windows, admission, eviction.

A vocabulary for day D decides which keys get their own embedding:

- day counts: how often each (non-missing) key occurs in D's events;
- windowed counts: the sum of the day counts of the last `window_days` days
  ending at D.  Each day is counted once, ever: the stage keeps day counts and
  a daily run only counts D and merges;
- admission is sticky: a key is admitted once its windowed count reaches
  `min_count`, and stays admitted (its embedding stays in the store) until it
  has been unseen for more than `ttl_days`, when it is evicted;
- first_seen / last_seen carry over from the previous vocabulary, so both
  decisions are incremental.

The vocabulary table holds every key with a windowed count > 0 plus every key
still admitted; keys that are neither are forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.config import VocabConfig
from pipeline.keys import factorize_keys, field_of

VOCAB_COLUMNS = ("field", "key", "count", "first_seen", "last_seen", "admitted")


@dataclass(frozen=True, slots=True)
class VocabUpdate:
    vocab: pd.DataFrame
    """field int16, key int64, count int64 (windowed), first_seen, last_seen (YYYY-MM-DD), admitted bool; sorted by key."""
    evicted: pd.DataFrame
    """field int16, key int64, last_seen: keys admitted before D and dropped by the TTL."""


def count_keys(events: pd.DataFrame, fields: Sequence[str]) -> pd.DataFrame:
    """(field, key, count) of the non-missing values of `fields` (field index = position in `fields`).

    Missing values are not counted: their key always exists.

    Args:
        events: events rows (a partition or a whole day).
        fields: categorical column names in field-index order.

    Returns:
        One row per distinct key, sorted by key.
    """
    frames = []
    for j, name in enumerate(fields):
        codes, keys = factorize_keys(j, events[name])
        counts = np.bincount(codes[codes >= 0], minlength=len(keys)).astype(np.int64)
        frames.append(pd.DataFrame({"key": keys, "count": counts}))
    return merge_counts(frames)


def merge_counts(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Sum (field, key, count) frames, e.g. per-partition counts into a day's, sorted by key."""
    frames = [f[["key", "count"]] for f in frames if len(f)]
    if not frames:
        return _counts_frame(np.empty(0, np.int64), np.empty(0, np.int64))
    summed = pd.concat(frames, ignore_index=True).groupby("key", sort=True)["count"].sum()
    summed = summed[summed > 0]
    return _counts_frame(summed.index.to_numpy(np.int64), summed.to_numpy(np.int64))


def window_counts(day_counts: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Sum day counts over dates: (field, key, count, first_date, last_date) of the window.

    Args:
        day_counts: date (YYYY-MM-DD) -> that day's (field, key, count).
    """
    frames = [f[["key", "count"]].assign(date=d) for d, f in sorted(day_counts.items()) if len(f)]
    if not frames:
        out = _counts_frame(np.empty(0, np.int64), np.empty(0, np.int64))
        return out.assign(first_date=pd.Series([], dtype="str"), last_date=pd.Series([], dtype="str"))
    g = pd.concat(frames, ignore_index=True).groupby("key", sort=True)
    out = g.agg(count=("count", "sum"), first_date=("date", "min"), last_date=("date", "max"))
    counts = _counts_frame(out.index.to_numpy(np.int64), out["count"].to_numpy(np.int64))
    counts["first_date"] = out["first_date"].to_numpy()
    counts["last_date"] = out["last_date"].to_numpy()
    return counts


def update_vocab(
    *, date: str, window: pd.DataFrame, previous: pd.DataFrame | None, config: VocabConfig
) -> VocabUpdate:
    """The vocabulary of `date` from its window counts and the previous vocabulary.

    Args:
        date: the run date D.
        window: `window_counts` of the days of the window ending at D.
        previous: the most recent vocabulary before D, or None on the first day.
        config: min_count (admission) and ttl_days (eviction).

    Returns:
        The new vocabulary and the keys evicted at D: previously admitted keys
        whose last_seen is more than ttl_days before D and whose windowed count
        is below min_count.
    """
    prev = previous if previous is not None else empty_vocab()
    prev = prev[["key", "first_seen", "last_seen", "admitted"]].rename(
        columns={"first_seen": "prev_first", "last_seen": "prev_last", "admitted": "was_admitted"}
    )
    m = window[["key", "count", "first_date", "last_date"]].merge(prev, on="key", how="outer", sort=True)
    count = m["count"].fillna(0).to_numpy(np.int64)
    first_seen = _pick(m["prev_first"], m["first_date"], np.minimum)
    last_seen = _pick(m["prev_last"], m["last_date"], np.maximum)
    was = m["was_admitted"].fillna(False).to_numpy(bool)
    age = (np.datetime64(date, "D") - last_seen.astype("datetime64[D]")).astype(np.int64)
    by_count = count >= config.min_count
    evicted = was & (age > config.ttl_days) & ~by_count
    admitted = by_count | (was & ~evicted)
    keep = (count > 0) | admitted
    keys = m["key"].to_numpy(np.int64)
    vocab = pd.DataFrame(
        {
            "field": field_of(keys[keep]).astype(np.int16),
            "key": keys[keep],
            "count": count[keep],
            "first_seen": pd.Series(first_seen[keep], dtype="str"),
            "last_seen": pd.Series(last_seen[keep], dtype="str"),
            "admitted": admitted[keep],
        }
    )
    gone = pd.DataFrame(
        {
            "field": field_of(keys[evicted]).astype(np.int16),
            "key": keys[evicted],
            "last_seen": pd.Series(last_seen[evicted], dtype="str"),
        }
    )
    return VocabUpdate(vocab=vocab, evicted=gone)


def field_stats(
    *, vocab: pd.DataFrame, evicted: pd.DataFrame, day_counts: pd.DataFrame, day_rows: int, fields: Sequence[str]
) -> list[dict]:
    """Per-field summary of a vocabulary for the manifest and the flow's metrics.

    seen: keys with a windowed count > 0; admitted / evicted: key counts;
    coverage: share of the day's rows whose value is admitted; oov_rate: share
    whose non-missing value is not; missing_rate: the rest.
    """
    admitted_keys = vocab["key"].to_numpy()[vocab["admitted"].to_numpy(bool)]
    today_admitted = np.isin(day_counts["key"].to_numpy(), admitted_keys)
    today = day_counts.assign(admitted=today_admitted)
    covered = today[today_admitted].groupby("field")["count"].sum()
    present = today.groupby("field")["count"].sum()
    seen = vocab[vocab["count"] > 0].groupby("field").size()
    n_admitted = vocab[vocab["admitted"]].groupby("field").size()
    n_evicted = evicted.groupby("field").size()
    rows = max(day_rows, 1)
    out = []
    for j, name in enumerate(fields):
        cov = int(covered.get(j, 0)) / rows
        pres = int(present.get(j, 0)) / rows
        out.append(
            {
                "field": name,
                "seen": int(seen.get(j, 0)),
                "admitted": int(n_admitted.get(j, 0)),
                "evicted": int(n_evicted.get(j, 0)),
                "coverage": round(cov, 6),
                "oov_rate": round(pres - cov, 6),
                "missing_rate": round(1.0 - pres, 6),
            }
        )
    return out


def empty_vocab() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "field": np.empty(0, np.int16),
            "key": np.empty(0, np.int64),
            "count": np.empty(0, np.int64),
            "first_seen": pd.Series([], dtype="str"),
            "last_seen": pd.Series([], dtype="str"),
            "admitted": np.empty(0, bool),
        }
    )


def _counts_frame(keys: np.ndarray, counts: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"field": field_of(keys).astype(np.int16), "key": keys, "count": counts})


def _pick(a: pd.Series, b: pd.Series, combine) -> np.ndarray:
    """Element-wise combine of two optional YYYY-MM-DD columns (either may be missing)."""
    a_v = a.to_numpy(dtype=object)
    b_v = b.to_numpy(dtype=object)
    a_ok, b_ok = pd.notna(a).to_numpy(), pd.notna(b).to_numpy()
    da = np.where(a_ok, a_v, b_v).astype("datetime64[D]") if len(a_v) else np.empty(0, "datetime64[D]")
    db = np.where(b_ok, b_v, a_v).astype("datetime64[D]") if len(b_v) else np.empty(0, "datetime64[D]")
    return combine(da, db).astype(str)
