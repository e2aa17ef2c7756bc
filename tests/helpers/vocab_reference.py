"""The vocabulary as it was computed before the merge was bucketed: one process, whole pandas tables.

Kept verbatim as the specification the stage must equal (every committed
table, count, date, evicted key and report number, including which keys win a
tie at the per-field cap): `tests/pipeline/vocab/test_stage.py` replays the
stage's rules with `Reference` and compares.  Test code only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.config import VocabConfig
from pipeline.encode.keys import field_of
from pipeline.schema import CRITEO
from pipeline.vocab.counts import count_keys
from storage.io.dates import shift_date


def reference_window_counts(day_counts: Mapping[str, pd.DataFrame], *, date: str, decay: float) -> pd.DataFrame:
    frames = []
    end = np.datetime64(date, "D")
    for d, f in sorted(day_counts.items()):
        if len(f):
            day = np.datetime64(d, "D")
            weight = decay ** int((end - day).astype(np.int64))
            frames.append(
                pd.DataFrame(
                    {
                        "key": f["key"].to_numpy(np.int64),
                        "count": f["count"].to_numpy(np.int64),
                        "score": f["count"].to_numpy(np.float64) * weight,
                        "day": day.astype(np.int64),
                    }
                )
            )
    g = pd.concat(frames, ignore_index=True).groupby("key", sort=True)
    out = g.agg(count=("count", "sum"), score=("score", "sum"), first=("day", "min"), last=("day", "max"))
    counts = pd.DataFrame(
        {
            "field": field_of(out.index.to_numpy(np.int64)).astype(np.int16),
            "key": out.index.to_numpy(np.int64),
            "count": out["count"].to_numpy(np.int64),
        }
    )
    counts["score"] = out["score"].to_numpy(np.float64)
    counts["first_date"] = out["first"].to_numpy().astype("datetime64[D]").astype(str)
    counts["last_date"] = out["last"].to_numpy().astype("datetime64[D]").astype(str)
    return counts


def _pick(a: pd.Series, b: pd.Series, combine) -> np.ndarray:
    a_v, b_v = a.to_numpy(dtype=object), b.to_numpy(dtype=object)
    a_ok, b_ok = pd.notna(a).to_numpy(), pd.notna(b).to_numpy()
    da = np.where(a_ok, a_v, b_v).astype("datetime64[D]") if len(a_v) else np.empty(0, "datetime64[D]")
    db = np.where(b_ok, b_v, a_v).astype("datetime64[D]") if len(b_v) else np.empty(0, "datetime64[D]")
    return combine(da, db).astype(str)


def reference_within_cap(field, keys, score, admitted, cap):
    idx = np.flatnonzero(admitted)
    order = np.lexsort((keys[idx], -score[idx], field[idx]))
    ranked = idx[order]
    f = field[ranked]
    starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]]) if len(f) else np.empty(0, np.int64)
    rank = np.arange(len(ranked)) - np.repeat(starts, np.diff(np.r_[starts, len(ranked)]))
    out = np.zeros(len(keys), dtype=bool)
    out[ranked[rank < cap]] = True
    return out


def reference_update(
    *, date: str, window: pd.DataFrame, previous: pd.DataFrame | None, config: VocabConfig, fields: Sequence[str]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    thresholds = np.full(128, config.min_count, dtype=np.float64)
    for j, name in enumerate(fields):
        thresholds[j] = config.min_count_of(name)
    prev = (
        previous
        if previous is not None
        else pd.DataFrame(
            {
                "key": np.empty(0, np.int64),
                "first_seen": pd.Series([], dtype="str"),
                "last_seen": pd.Series([], dtype="str"),
                "admitted": np.empty(0, bool),
            }
        )
    )
    prev = prev[["key", "first_seen", "last_seen", "admitted"]].rename(
        columns={"first_seen": "prev_first", "last_seen": "prev_last", "admitted": "was_admitted"}
    )
    m = window[["key", "count", "score", "first_date", "last_date"]].merge(prev, on="key", how="outer", sort=True)
    count = m["count"].fillna(0).to_numpy(np.int64)
    score = m["score"].fillna(0.0).to_numpy(np.float64)
    first_seen = _pick(m["prev_first"], m["first_date"], np.minimum)
    last_seen = _pick(m["prev_last"], m["last_date"], np.maximum)
    was = m["was_admitted"].fillna(False).to_numpy(bool)
    age = (np.datetime64(date, "D") - last_seen.astype("datetime64[D]")).astype(np.int64)
    keys = m["key"].to_numpy(np.int64)
    field = field_of(keys).astype(np.int16)
    by_count = score >= thresholds[field] - 1e-9
    expired = was & (age > config.ttl_days) & ~by_count
    admitted = by_count | (was & ~expired)
    if config.max_keys_per_field:
        admitted &= reference_within_cap(field, keys, score, admitted, config.max_keys_per_field)
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
        {"field": field[evicted], "key": keys[evicted], "last_seen": pd.Series(last_seen[evicted], dtype="str")}
    )
    return vocab, gone


def reference_stats(vocab, evicted, day_counts, day_rows, fields) -> list[dict]:
    admitted_keys = vocab["key"].to_numpy()[vocab["admitted"].to_numpy(bool)]
    today_admitted = np.isin(day_counts["key"].to_numpy(), admitted_keys)
    today = day_counts.assign(admitted=today_admitted)
    covered = today[today_admitted].groupby("field")["count"].sum()
    present = today.groupby("field")["count"].sum()
    seen = vocab[vocab["count"] > 0].groupby("field").size()
    n_admitted = vocab[vocab["admitted"]].groupby("field").size()
    n_evicted = evicted.groupby("field").size()
    out = []
    for j, name in enumerate(fields):
        cov, pres = int(covered.get(j, 0)) / day_rows, int(present.get(j, 0)) / day_rows
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


class Reference:
    """Replays the stage's rules (window = committed days, previous = latest committed) on whole tables."""

    def __init__(self, root: Path, fields: Sequence[str] = CRITEO.categorical) -> None:
        self.root = root
        self.fields = list(fields)
        self.days: dict[str, pd.DataFrame] = {}
        self.vocabs: dict[str, pd.DataFrame] = {}

    def build(self, date: str, config: VocabConfig) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
        events = pd.read_parquet(self.root / "events" / f"date={date}", columns=self.fields)
        self.days[date] = count_keys(events, self.fields)
        window = {d: self.days[d] for d in self.days if shift_date(date, -config.window_days) < d <= date}
        earlier = [d for d in self.vocabs if d < date]
        previous = self.vocabs[max(earlier)] if earlier else None
        w = reference_window_counts(window, date=date, decay=config.decay)
        vocab, evicted = reference_update(date=date, window=w, previous=previous, config=config, fields=self.fields)
        self.vocabs[date] = vocab
        return vocab, evicted, reference_stats(vocab, evicted, self.days[date], len(events), self.fields)
