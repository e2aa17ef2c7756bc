"""Feature vocabulary logic (pure pandas/NumPy): counting, windows, admission, eviction.

A vocabulary for day D decides which keys get their own embedding:

- day counts: how often each (non-missing) key occurs in D's events;
- windowed counts: the sum of the day counts of the last `window_days` days
  ending at D.  Each day is counted once, ever: the stage keeps day counts and
  a daily run only counts D and merges;
- score: the windowed count with optional decay, sum of count_d * decay**(D - d)
  (decay = 1: score == count);
- admission is sticky: a key is admitted once its score reaches its field's
  min_count (`min_count_per_field` overrides `min_count`), and stays admitted
  (its embedding stays in the store) until it has been unseen for more than
  `ttl_days`, when it is evicted;
- a per-field cap (`max_keys_per_field`) keeps only the highest-scoring
  admitted keys (ties: smaller key); keys pushed out are evicted too;
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

VOCAB_COLUMNS = ("field", "key", "count", "score", "first_seen", "last_seen", "admitted")


@dataclass(frozen=True, slots=True)
class VocabUpdate:
    vocab: pd.DataFrame
    """field int16, key int64, count int64 (windowed), score float64 (decayed count), first_seen,
    last_seen (YYYY-MM-DD), admitted bool; sorted by key."""
    evicted: pd.DataFrame
    """field int16, key int64, last_seen: keys admitted before D and dropped by the TTL or the cap."""


def count_keys(events: pd.DataFrame, fields: Sequence[str]) -> pd.DataFrame:
    """(field, key, count) of the non-missing values of `fields` (field index = position in `fields`).

    Missing values are not counted: their key always exists.

    Args:
        events: events rows (a partition or a whole day), or any mapping of column
            name -> values; a multi-valued field is passed flattened (one entry per value).
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


def window_counts(day_counts: Mapping[str, pd.DataFrame], *, date: str | None = None, decay: float = 1.0) -> pd.DataFrame:
    """Sum day counts over dates: (field, key, count, score, first_date, last_date) of the window.

    Args:
        day_counts: date (YYYY-MM-DD) -> that day's (field, key, count).
        date: the run date the decay counts from (default: the latest date given).
        decay: a day k days before `date` adds decay**k * count to `score`.
    """
    frames = []
    if day_counts:
        end = np.datetime64(date or max(day_counts), "D")
        for d, f in sorted(day_counts.items()):
            if len(f):
                day = np.datetime64(d, "D")
                weight = decay ** int((end - day).astype(np.int64))
                frames.append(pd.DataFrame({
                    "key": f["key"].to_numpy(np.int64), "count": f["count"].to_numpy(np.int64),
                    "score": f["count"].to_numpy(np.float64) * weight, "day": day.astype(np.int64),
                }))  # fmt: skip
    if not frames:
        out = _counts_frame(np.empty(0, np.int64), np.empty(0, np.int64))
        return out.assign(
            score=np.empty(0, np.float64), first_date=pd.Series([], dtype="str"), last_date=pd.Series([], dtype="str")
        )
    g = pd.concat(frames, ignore_index=True).groupby("key", sort=True)
    out = g.agg(count=("count", "sum"), score=("score", "sum"), first=("day", "min"), last=("day", "max"))
    counts = _counts_frame(out.index.to_numpy(np.int64), out["count"].to_numpy(np.int64))
    counts["score"] = out["score"].to_numpy(np.float64)
    counts["first_date"] = out["first"].to_numpy().astype("datetime64[D]").astype(str)
    counts["last_date"] = out["last"].to_numpy().astype("datetime64[D]").astype(str)
    return counts


def update_vocab(
    *,
    date: str,
    window: pd.DataFrame,
    previous: pd.DataFrame | None,
    config: VocabConfig,
    fields: Sequence[str] = (),
) -> VocabUpdate:
    """The vocabulary of `date` from its window counts and the previous vocabulary.

    Args:
        date: the run date D.
        window: `window_counts` of the days of the window ending at D.
        previous: the most recent vocabulary before D, or None on the first day.
        config: min_count (+ per-field overrides), ttl_days, max_keys_per_field.
        fields: categorical column names in field-index order (needed for
            `min_count_per_field`; a name there that is not a field is an error).

    Returns:
        The new vocabulary and the keys evicted at D: previously admitted keys
        no longer admitted, because their last_seen is more than ttl_days
        before D and their score is below min_count, or because the per-field
        cap pushed them out.

    Raises:
        ValueError: `min_count_per_field` names a field not in `fields`.
    """
    unknown = sorted(set(config.min_count_per_field) - set(fields))
    if unknown:
        raise ValueError(f"vocab.min_count_per_field names unknown fields {unknown}; fields are {list(fields)}")
    thresholds = np.full(128, config.min_count, dtype=np.float64)
    for j, name in enumerate(fields):
        thresholds[j] = config.min_count_of(name)
    prev = previous if previous is not None else empty_vocab()
    prev = prev[["key", "first_seen", "last_seen", "admitted"]].rename(
        columns={"first_seen": "prev_first", "last_seen": "prev_last", "admitted": "was_admitted"}
    )
    if "score" not in window:
        window = window.assign(score=window["count"].astype(np.float64))
    m = window[["key", "count", "score", "first_date", "last_date"]].merge(prev, on="key", how="outer", sort=True)
    count = m["count"].fillna(0).to_numpy(np.int64)
    score = m["score"].fillna(0.0).to_numpy(np.float64)
    first_seen = _pick(m["prev_first"], m["first_date"], np.minimum)
    last_seen = _pick(m["prev_last"], m["last_date"], np.maximum)
    was = m["was_admitted"].fillna(False).to_numpy(bool)
    age = (np.datetime64(date, "D") - last_seen.astype("datetime64[D]")).astype(np.int64)
    keys = m["key"].to_numpy(np.int64)
    field = field_of(keys).astype(np.int16)
    by_count = score >= thresholds[field] - 1e-9  # decayed sums are floats
    expired = was & (age > config.ttl_days) & ~by_count
    admitted = by_count | (was & ~expired)
    if config.max_keys_per_field:
        admitted &= _within_cap(field, keys, score, admitted, config.max_keys_per_field)
    evicted = was & ~admitted
    keep = (count > 0) | admitted
    vocab = pd.DataFrame(
        {
            "field": field[keep],
            "key": keys[keep],
            "count": count[keep],
            "score": score[keep],
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


def _within_cap(field: np.ndarray, keys: np.ndarray, score: np.ndarray, admitted: np.ndarray, cap: int) -> np.ndarray:
    """Mask of the keys that are among the `cap` highest-scoring admitted keys of their field."""
    idx = np.flatnonzero(admitted)
    order = np.lexsort((keys[idx], -score[idx], field[idx]))  # by field, score desc, key asc
    ranked = idx[order]
    f = field[ranked]
    starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]]) if len(f) else np.empty(0, np.int64)
    rank = np.arange(len(ranked)) - np.repeat(starts, np.diff(np.r_[starts, len(ranked)]))
    out = np.zeros(len(keys), dtype=bool)
    out[ranked[rank < cap]] = True
    return out


def field_stats(
    *,
    vocab: pd.DataFrame,
    evicted: pd.DataFrame,
    day_counts: pd.DataFrame,
    day_rows: int,
    fields: Sequence[str],
    multi_valued: Sequence[str] = (),
) -> list[dict]:
    """Per-field summary of a vocabulary for the manifest, the report and the flow's metrics.

    seen: keys with a windowed count > 0; admitted / evicted: key counts;
    coverage: share of the day's rows whose value is admitted; oov_rate: share
    whose non-missing value is not; missing_rate: the rest.  For a
    multi-valued field coverage and oov_rate are shares of the day's values
    (not rows) and missing_rate is None.
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
        if name in multi_valued:
            values = max(int(present.get(j, 0)), 1)
            cov, pres, missing = int(covered.get(j, 0)) / values, 1.0, None
        else:
            cov = int(covered.get(j, 0)) / rows
            pres = int(present.get(j, 0)) / rows
            missing = round(1.0 - pres, 6)
        out.append(
            {
                "field": name,
                "seen": int(seen.get(j, 0)),
                "admitted": int(n_admitted.get(j, 0)),
                "evicted": int(n_evicted.get(j, 0)),
                "coverage": round(cov, 6),
                "oov_rate": round(pres - cov, 6),
                "missing_rate": missing,
            }
        )
    return out


def report_markdown(date: str, stats: Sequence[dict], *, window_dates: Sequence[str], config: VocabConfig) -> str:
    """A short markdown summary of a vocabulary (`report.md`) for the flow to publish."""
    admitted = sum(s["admitted"] for s in stats)
    seen = sum(s["seen"] for s in stats)
    evicted = sum(s["evicted"] for s in stats)
    worst = sorted(stats, key=lambda s: s["oov_rate"], reverse=True)[:5]
    lines = [
        f"# Vocabulary {date}",
        "",
        f"Window: {', '.join(window_dates)} (window_days={config.window_days}, decay={config.decay}); "
        f"min_count={config.min_count}"
        + (f", per field {dict(config.min_count_per_field)}" if config.min_count_per_field else "")
        + f"; ttl_days={config.ttl_days}"
        + (f"; max_keys_per_field={config.max_keys_per_field}" if config.max_keys_per_field else ""),
        "",
        f"**{admitted:,}** keys admitted of {seen:,} seen; **{evicted:,}** evicted.",
        "",
        "| field | seen | admitted | evicted | coverage | OOV rate | missing |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in stats:
        missing = "-" if s["missing_rate"] is None else f"{s['missing_rate']:.2%}"
        lines.append(
            f"| {s['field']} | {s['seen']:,} | {s['admitted']:,} | {s['evicted']:,} | {s['coverage']:.2%} "
            f"| {s['oov_rate']:.2%} | {missing} |"
        )
    lines += ["", "Highest OOV rates: " + ", ".join(f"{s['field']} {s['oov_rate']:.2%}" for s in worst), ""]
    return "\n".join(lines)


def empty_vocab() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "field": np.empty(0, np.int16),
            "key": np.empty(0, np.int64),
            "count": np.empty(0, np.int64),
            "score": np.empty(0, np.float64),
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
