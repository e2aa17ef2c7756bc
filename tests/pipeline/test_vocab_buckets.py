"""The bucketed, distributed vocabulary equals the single-table one, whatever the buckets, merge mode or history.

`reference_*` below is the vocabulary code as it was before the merge was
distributed (one process, whole tables), kept verbatim as the specification:
every committed table, count, date, evicted key and report number of the
stage must equal it, including which keys win a tie at the per-field cap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import VocabConfig
from pipeline.keys import field_of
from pipeline.schema import CRITEO
from pipeline.vocab import (
    combine,
    count_keys,
    day_dictionary,
    day_numbers,
    delta_combine,
    delta_vocab,
    field_totals,
    split_vocab,
    update_vocab,
    window_counts,
    window_table,
)
from pipeline.vocab_merge import (
    MERGE_ROWS_PER_BUCKET,
    CapSearch,
    auto_buckets,
    bucket_bounds,
    bucket_of,
    cap_histograms,
    cap_mask,
    hx_of,
    score_bits,
    source_buckets,
)
from pipeline.vocab_stage import build_vocab, load_admitted, load_evicted, load_report
from storage.io.dates import date_range, shift_date
from storage.io.layout import Layout

FIELDS = list(CRITEO.categorical)


# ---- the reference: the single-process implementation before the merge was bucketed ----------------
def reference_window_counts(day_counts: Mapping[str, pd.DataFrame], *, date: str, decay: float) -> pd.DataFrame:
    frames = []
    end = np.datetime64(date, "D")
    for d, f in sorted(day_counts.items()):
        if len(f):
            day = np.datetime64(d, "D")
            weight = decay ** int((end - day).astype(np.int64))
            frames.append(pd.DataFrame({
                "key": f["key"].to_numpy(np.int64), "count": f["count"].to_numpy(np.int64),
                "score": f["count"].to_numpy(np.float64) * weight, "day": day.astype(np.int64),
            }))  # fmt: skip
    g = pd.concat(frames, ignore_index=True).groupby("key", sort=True)
    out = g.agg(count=("count", "sum"), score=("score", "sum"), first=("day", "min"), last=("day", "max"))
    counts = pd.DataFrame({"field": field_of(out.index.to_numpy(np.int64)).astype(np.int16),
                           "key": out.index.to_numpy(np.int64), "count": out["count"].to_numpy(np.int64)})  # fmt: skip
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


def _within_cap(field, keys, score, admitted, cap):
    idx = np.flatnonzero(admitted)
    order = np.lexsort((keys[idx], -score[idx], field[idx]))
    ranked = idx[order]
    f = field[ranked]
    starts = np.flatnonzero(np.r_[True, f[1:] != f[:-1]]) if len(f) else np.empty(0, np.int64)
    rank = np.arange(len(ranked)) - np.repeat(starts, np.diff(np.r_[starts, len(ranked)]))
    out = np.zeros(len(keys), dtype=bool)
    out[ranked[rank < cap]] = True
    return out


def reference_update(*, date: str, window: pd.DataFrame, previous: pd.DataFrame | None, config: VocabConfig,
                     fields: Sequence[str]) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    thresholds = np.full(128, config.min_count, dtype=np.float64)
    for j, name in enumerate(fields):
        thresholds[j] = config.min_count_of(name)
    prev = previous if previous is not None else pd.DataFrame(
        {"key": np.empty(0, np.int64), "first_seen": pd.Series([], dtype="str"),
         "last_seen": pd.Series([], dtype="str"), "admitted": np.empty(0, bool)})  # fmt: skip
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
        admitted &= _within_cap(field, keys, score, admitted, config.max_keys_per_field)
    evicted = was & ~admitted
    keep = (count > 0) | admitted
    vocab = pd.DataFrame({"field": field[keep], "key": keys[keep], "count": count[keep], "score": score[keep],
                          "first_seen": pd.Series(first_seen[keep], dtype="str"),
                          "last_seen": pd.Series(last_seen[keep], dtype="str"), "admitted": admitted[keep]})  # fmt: skip
    gone = pd.DataFrame({"field": field[evicted], "key": keys[evicted],
                         "last_seen": pd.Series(last_seen[evicted], dtype="str")})  # fmt: skip
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
        out.append({"field": name, "seen": int(seen.get(j, 0)), "admitted": int(n_admitted.get(j, 0)),
                    "evicted": int(n_evicted.get(j, 0)), "coverage": round(cov, 6), "oov_rate": round(pres - cov, 6),
                    "missing_rate": round(1.0 - pres, 6)})  # fmt: skip
    return out


class Reference:
    """Replays the stage's rules (window = committed days, previous = latest committed) on whole tables."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.days: dict[str, pd.DataFrame] = {}
        self.vocabs: dict[str, pd.DataFrame] = {}

    def build(self, date: str, config: VocabConfig) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
        events = pd.read_parquet(self.root / "events" / f"date={date}", columns=FIELDS)
        self.days[date] = count_keys(events, FIELDS)
        window = {d: self.days[d] for d in self.days if shift_date(date, -config.window_days) < d <= date}
        earlier = [d for d in self.vocabs if d < date]
        previous = self.vocabs[max(earlier)] if earlier else None
        w = reference_window_counts(window, date=date, decay=config.decay)
        vocab, evicted = reference_update(date=date, window=w, previous=previous, config=config, fields=FIELDS)
        self.vocabs[date] = vocab
        return vocab, evicted, reference_stats(vocab, evicted, self.days[date], len(events), FIELDS)


# ---- events: small value domains, so counts tie and keys come and go --------------------------------
def write_events(root: Path, date: str, *, seed: int, rows: int = 1200, parts: int = 2) -> None:
    rng = np.random.default_rng(seed)
    out = root / "events" / f"date={date}"
    out.mkdir(parents=True, exist_ok=True)
    schema = CRITEO.events_schema()
    names = []
    for p, chunk in enumerate(np.array_split(np.arange(rows), parts)):
        n = len(chunk)
        cols = {"label": pa.array(rng.integers(0, 2, n).astype(np.int8)), "ts": pa.nulls(n, pa.int64()),
                "order": pa.array(chunk.astype(np.int64))}  # fmt: skip
        for name in CRITEO.dense:
            cols[name] = pa.array(rng.random(n).astype(np.float32))
        for j, name in enumerate(FIELDS):
            domain = 4 if j < 3 else 40 + 20 * (j % 5)  # a few tiny fields (no cap cut), most cut by the cap
            ids = (rng.zipf(1.4, n) + seed * (j % 3 == 0) * 7) % domain  # some fields drift day to day
            values = np.array([f"v{i}" for i in ids], dtype=object)
            values[rng.random(n) < 0.05] = None
            cols[name] = pa.array(values, type=pa.string())
        names.append({"name": f"part-{p:05d}.parquet", "rows": n})
        pq.write_table(pa.table(cols, schema=schema), out / names[-1]["name"])
    (out / "_SUCCESS.json").write_text(json.dumps({"date": date, "format": "criteo", "rows_written": rows,
                                                   "parts": names, "run_id": f"events-{date}-{seed}"}))  # fmt: skip


def committed(root: Path, date: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    d = root / "vocab" / f"date={date}"
    vocab = pd.read_parquet(d / "vocab.parquet").sort_values("key", ignore_index=True)
    evicted = pd.read_parquet(d / "evicted.parquet")
    return vocab, evicted, json.loads((d / "_SUCCESS.json").read_text())


def assert_same_as_reference(root: Path, date: str, ref: tuple[pd.DataFrame, pd.DataFrame, list[dict]]) -> dict:
    vocab, evicted, manifest = committed(root, date)
    want_vocab, want_evicted, want_stats = ref
    pd.testing.assert_frame_equal(vocab, want_vocab, check_exact=True, check_dtype=False, obj=f"vocab {date}")
    assert evicted["key"].is_monotonic_increasing
    pd.testing.assert_frame_equal(evicted.reset_index(drop=True), want_evicted.reset_index(drop=True),
                                  check_exact=True, check_dtype=False, obj=f"evicted {date}")  # fmt: skip
    assert manifest["per_field"] == want_stats
    report = load_report(Layout(str(root)), date).drop(columns="date")
    assert report.to_dict("records") == want_stats
    assert manifest["admitted"] == int(want_vocab["admitted"].sum()) and manifest["evicted"] == len(want_evicted)
    assert manifest["seen"] == int((want_vocab["count"] > 0).sum())
    np.testing.assert_array_equal(load_admitted(Layout(str(root)), date), np.sort(want_vocab.loc[want_vocab["admitted"], "key"]))
    np.testing.assert_array_equal(load_evicted(Layout(str(root)), date), np.sort(want_evicted["key"]))
    return manifest


DATES = date_range("2026-03-01", "2026-03-09")


@pytest.fixture(scope="module")
def events_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("vocab-buckets")
    for i, d in enumerate(DATES):
        write_events(root, d, seed=i + 1)
    return root


def fresh_root(events_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "events").mkdir(parents=True)
    for d in DATES:
        (root / "events" / f"date={d}").symlink_to(events_root / "events" / f"date={d}")
    return root


# ---- the stage against the reference ------------------------------------------------------------------
def test_daily_delta_merges_equal_the_reference_including_ties_at_the_cap(events_root, tmp_path, client):
    root = fresh_root(events_root, tmp_path)
    cfg = VocabConfig(window_days=3, min_count=2, ttl_days=2, max_keys_per_field=12, merge_buckets=5,
                      min_count_per_field={"C7": 4})  # fmt: skip
    ref = Reference(root)
    modes, evicted, split_ties = [], 0, 0
    for d in DATES:
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
        manifest = assert_same_as_reference(root, d, ref.build(d, cfg))
        modes.append(manifest["merge"])
        evicted += manifest["evicted"]
        vocab = committed(root, d)[0]
        cut = vocab[vocab["admitted"]].groupby("field")["score"].min()
        out = vocab[~vocab["admitted"] & (vocab["score"] >= 4)]  # above every min_count, so out by the cap
        split_ties += int((out["score"].to_numpy() == cut.reindex(out["field"]).to_numpy()).sum())
    assert modes == ["window"] + ["delta"] * (len(DATES) - 1)
    assert evicted > 0  # the TTL and the cap both evicted keys along the way
    assert split_ties > 0, "no tie at the cap was exercised: some keys with the cut score in, some out"
    per_field = vocab[vocab["admitted"]].groupby("field").size()
    assert per_field.max() == 12 and per_field.min() < 12  # the cap cut most fields, not the tiny ones


def test_uncapped_daily_delta_merges_equal_the_reference(events_root, tmp_path, client):
    """Without a cap a delta bucket goes straight to its final rows (`delta_vocab`); TTL evictions included."""
    root = fresh_root(events_root, tmp_path)
    cfg = VocabConfig(window_days=3, min_count=2, ttl_days=1, merge_buckets=4, min_count_per_field={"C7": 4})
    ref = Reference(root)
    modes, evicted = [], 0
    for d in DATES:
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
        manifest = assert_same_as_reference(root, d, ref.build(d, cfg))
        modes.append(manifest["merge"])
        evicted += manifest["evicted"]
    assert modes == ["window"] + ["delta"] * (len(DATES) - 1)
    assert evicted > 0
    schema = pq.read_schema(root / "vocab" / f"date={DATES[-1]}" / "vocab.parquet" / "part-00000.parquet")
    assert schema.field("first_seen").type == pa.string() and not schema.field("key").nullable


def test_decay_gaps_and_changing_bucket_counts_equal_the_reference(events_root, tmp_path, client):
    """Decayed float scores (window merge, several radix rounds for the cap), a missing day, B varying per day."""
    root = fresh_root(events_root, tmp_path)
    ref = Reference(root)
    plan = [(DATES[0], 3), (DATES[1], 8), (DATES[3], 1), (DATES[4], 6), (DATES[5], 0), (DATES[6], 7)]
    for d, buckets in plan:
        cfg = VocabConfig(window_days=4, min_count=2, ttl_days=3, decay=0.7, max_keys_per_field=9,
                          merge_buckets=buckets)  # fmt: skip
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
        manifest = assert_same_as_reference(root, d, ref.build(d, cfg))
        assert manifest["merge"] == "window" and manifest["buckets"] == (buckets or 1)


def test_incremental_and_full_window_merges_give_identical_files(events_root, tmp_path, client):
    root = fresh_root(events_root, tmp_path)
    cfg = VocabConfig(window_days=3, min_count=2, ttl_days=3, max_keys_per_field=15, merge_buckets=4)
    for d in DATES[:5]:
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
    delta = committed(root, DATES[4])
    again = build_vocab(DATES[4], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client, force=True)
    assert committed(root, DATES[4])[2]["merge"] == "delta" and not again.skipped  # an idempotent rerun
    full = build_vocab(DATES[4], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client, force=True, incremental=False)
    window = committed(root, DATES[4])
    assert window[2]["merge"] == "window" and full.admitted == delta[2]["admitted"]
    for a, b in zip(delta[:2], window[:2], strict=True):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    parts = sorted(p.name for p in (root / "vocab" / f"date={DATES[4]}" / "vocab.parquet").iterdir())
    assert parts == [f"part-{b:05d}.parquet" for b in range(4)]
    assert not list((root / "vocab" / f"date={DATES[4]}").glob("_scratch"))


def test_a_rebuilt_day_in_the_window_turns_the_next_merge_back_to_the_full_window(events_root, tmp_path, client):
    root = fresh_root(events_root, tmp_path)
    cfg = VocabConfig(window_days=3, min_count=2, merge_buckets=3)
    ref = Reference(root)
    for d in DATES[:3]:
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
        ref.build(d, cfg)
    build_vocab(DATES[1], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client, force=True)  # new run id
    build_vocab(DATES[3], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
    assert committed(root, DATES[3])[2]["merge"] == "window"
    assert_same_as_reference(root, DATES[3], ref.build(DATES[3], cfg))


def test_vocabularies_written_before_bucketing_are_read_as_one_bucket(events_root, tmp_path, client):
    """A committed day from the single-file layout (no `buckets` in its manifest) still feeds the window."""
    root = fresh_root(events_root, tmp_path)
    cfg = VocabConfig(window_days=3, min_count=2, merge_buckets=4)
    ref = Reference(root)
    for d in DATES[:2]:
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
        ref.build(d, cfg)
        vdir = root / "vocab" / f"date={d}"
        for name in ("vocab", "day_counts"):  # rewrite as the old single files, sorted by key
            frame = pd.read_parquet(vdir / f"{name}.parquet").sort_values("key", ignore_index=True)
            for p in (vdir / f"{name}.parquet").iterdir():
                p.unlink()
            (vdir / f"{name}.parquet").rmdir()
            frame.to_parquet(vdir / f"{name}.parquet", index=False)
        manifest = json.loads((vdir / "_SUCCESS.json").read_text())
        for k in ("buckets", "window_runs", "day_keys", "vocab_rows", "merge"):
            manifest.pop(k)
        (vdir / "_SUCCESS.json").write_text(json.dumps(manifest))
    build_vocab(DATES[2], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
    assert committed(root, DATES[2])[2]["merge"] == "window"
    assert_same_as_reference(root, DATES[2], ref.build(DATES[2], cfg))


def test_the_previous_bucketed_layout_with_large_string_dates_still_feeds_a_delta_merge(events_root, tmp_path, client):
    """Parts written before the dictionary-encoded dates (large_string, Arrow schema stored) read the same."""
    root = fresh_root(events_root, tmp_path)
    cfg = VocabConfig(window_days=2, min_count=2, ttl_days=2, merge_buckets=3)
    ref = Reference(root)
    for d in DATES[:3]:
        build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
        ref.build(d, cfg)
    old = pa.schema([("field", pa.int16()), ("key", pa.int64()), ("count", pa.int64()), ("score", pa.float64()),
                     ("first_seen", pa.large_string()), ("last_seen", pa.large_string()), ("admitted", pa.bool_())])  # fmt: skip
    for part in (root / "vocab" / f"date={DATES[2]}" / "vocab.parquet").iterdir():
        pq.write_table(pq.read_table(part).cast(old), part)  # as the previous code wrote it
    assert pq.read_schema(part).field("first_seen").type == pa.large_string()
    build_vocab(DATES[3], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
    manifest = assert_same_as_reference(root, DATES[3], ref.build(DATES[3], cfg))
    assert manifest["merge"] == "delta"
    vocab = pd.read_parquet(root / "vocab" / f"date={DATES[3]}" / "vocab.parquet")
    assert vocab["first_seen"].map(type).eq(str).all()  # readers see plain strings, not categoricals


def test_day_numbers_read_strings_dictionaries_and_date32_alike():
    days = np.array([20000, 20001, 20000, 19000, 20003], np.int64)
    text = pa.array(days.astype("datetime64[D]")).cast(pa.string())
    for dates in (text, text.cast(pa.large_string()), day_dictionary(days), text.cast(pa.date32()),
                  pa.chunked_array([day_dictionary(days[:2]), day_dictionary(days[2:])]), text.to_pandas()):  # fmt: skip
        np.testing.assert_array_equal(day_numbers(dates), days)
    spread = np.array([0, 1 << 17, 5], np.int64)  # a span too wide for a range of names: the distinct days instead
    np.testing.assert_array_equal(day_numbers(day_dictionary(spread)), spread)
    assert len(day_numbers(day_dictionary(np.empty(0, np.int64)))) == 0


@pytest.mark.parametrize("seed", range(4))
def test_the_delta_merge_equals_combining_the_summed_window(seed):
    """previous + today - dropped, merged as sorted arrays, equals re-summing the window's day counts."""
    rng = np.random.default_rng(seed)
    date, window_days = 20100, 3

    def day(n: int) -> tuple[np.ndarray, np.ndarray]:
        keys = np.unique((rng.integers(0, 3, n) << 56) | rng.integers(2, 400, n))
        return keys, rng.integers(1, 4, len(keys)).astype(np.int64)

    days = {date - k: day(int(rng.integers(0, 300))) for k in range(window_days + 1)}  # D - 3 .. D
    thresholds = np.full(128, 3.0)
    # the vocabulary of D - 1: its window D - 3 .. D - 1 on top of an older vocabulary with admitted keys
    older = {"key": np.unique((rng.integers(0, 3, 50) << 56) | rng.integers(2, 400, 50))}
    older |= {"count": np.zeros(len(older["key"]), np.int64),
              "first": rng.integers(date - 40, date - 8, len(older["key"])),
              "last": rng.integers(date - 7, date - 4, len(older["key"])),  # ttl 5: some expire at D - 1, some at D
              "admitted": rng.random(len(older["key"])) < 0.7}  # fmt: skip
    window = window_table([(d, *days[d]) for d in range(date - window_days, date)], end=date - 1, decay=1.0)
    prev = combine(date=date - 1, window=window, previous=older, thresholds=thresholds, ttl_days=5)
    keep = (prev["count"] > 0) | prev["admitted"]
    previous = {"key": prev["key"][keep], "count": prev["count"][keep], "first": prev["first_seen"][keep],
                "last": prev["last_seen"][keep], "admitted": prev["admitted"][keep]}  # fmt: skip

    want = combine(date=date, window=window_table([(d, *days[d]) for d in range(date - window_days + 1, date + 1)],
                                                  end=date, decay=1.0),
                   previous=previous, thresholds=thresholds, ttl_days=5)  # fmt: skip
    got = delta_combine(date=date, previous=previous, today=days[date], dropped=days[date - window_days],
                        thresholds=thresholds, ttl_days=5)  # fmt: skip
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert (want["count"] == 0).any() and want["was_admitted"].any() and (want["was_admitted"] & ~want["admitted"]).any()

    with pytest.raises(ValueError, match="went negative"):  # a dropped day the previous vocabulary never counted
        delta_combine(date=date, previous=previous, today=days[date], dropped=(np.array([5]), np.array([1])),
                      thresholds=thresholds, ttl_days=5)  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
def test_the_fused_delta_merge_equals_the_delta_merge_split_and_summed(seed):
    """`delta_vocab` (no cap: straight to the kept rows, dates as dictionary indices) = delta_combine + split + totals."""
    rng = np.random.default_rng(100 + seed)
    date, ttl = 20100, 4

    def keys(n: int) -> np.ndarray:
        return np.unique((rng.integers(0, 4, n) << 56) | rng.integers(2, 300, n))

    prev_keys = keys(int(rng.integers(0, 500)))
    n = len(prev_keys)
    count = rng.integers(0, 5, n)
    last = rng.integers(date - 9, date, n)
    previous = {"key": prev_keys, "count": count, "first": last - rng.integers(0, 30, n), "last": last,
                "admitted": (rng.random(n) < 0.5) | (count >= 3)}  # fmt: skip
    today = keys(int(rng.integers(0, 200)))
    today = (today, rng.integers(1, 4, len(today)).astype(np.int64))
    some = prev_keys[(count > 0) & (rng.random(n) < 0.3)]  # the dropped day: keys the window counted
    dropped = (some, np.minimum(rng.integers(1, 3, len(some)), count[np.searchsorted(prev_keys, some)]))
    if seed == 0:
        dropped = None
    thresholds = np.full(128, 3.0)
    thresholds[1] = 2.0  # a per-field override
    want = split_vocab_with_totals(delta_combine(date=date, previous=previous, today=today, dropped=dropped,
                                                 thresholds=thresholds, ttl_days=ttl), today, n_fields=4)  # fmt: skip
    # the previous dates as a part stores them: indices into a dictionary, here with unused and unsorted days
    days = np.unique(np.r_[previous["first"], previous["last"], date - 50])[::-1]
    if seed % 2:
        days = np.r_[days, date]  # the run date already in the dictionary
    indexed = {**previous, "first": np.searchsorted(-days, -previous["first"]).astype(np.int32),
               "last": np.searchsorted(-days, -previous["last"]).astype(np.int32)}  # fmt: skip
    got = delta_vocab(date=date, previous=indexed, days=days, today=today, dropped=dropped, thresholds=thresholds,
                      ttl_days=ttl, n_fields=4)  # fmt: skip
    vocab = {**got.vocab, "first_seen": got.days[got.vocab["first_seen"]], "last_seen": got.days[got.vocab["last_seen"]]}
    for name, column in want[0].items():
        np.testing.assert_array_equal(vocab[name], column, err_msg=name)
        assert vocab[name].dtype == column.dtype or name in ("first_seen", "last_seen"), name
    for name, column in want[1].items():
        np.testing.assert_array_equal(got.evicted[name], column, err_msg=f"evicted {name}")
    for name in ("seen", "admitted", "evicted", "covered", "present"):
        np.testing.assert_array_equal(getattr(got.totals, name), getattr(want[2], name), err_msg=name)
    if seed == 1:
        assert len(want[1]["key"]) and (want[0]["count"] == 0).any() and len(want[0]["key"]) < len(prev_keys) + 200


def split_vocab_with_totals(merged, today, *, n_fields):
    vocab, gone = split_vocab(merged, merged["admitted"])
    on = np.zeros(len(merged["key"]), np.int64)
    on[np.searchsorted(merged["key"], today[0])] = today[1]
    totals = field_totals(field=merged["field"], count=merged["count"], admitted=merged["admitted"],
                          evicted=merged["was_admitted"] & ~merged["admitted"], today=on, n_fields=n_fields)  # fmt: skip
    return vocab, gone, totals


# ---- buckets and the cap search (pure) ------------------------------------------------------------------
def test_buckets_are_hash_ranges_in_key_order_within_a_field():
    rng = np.random.default_rng(0)
    keys = np.sort((rng.integers(0, 3, 5000) << 56) | rng.integers(2, 1 << 56, 5000))
    for buckets in (1, 3, 7, 64):
        b = bucket_of(keys, buckets)
        assert b.min() >= 0 and b.max() < buckets
        for f in range(3):
            assert np.all(np.diff(b[field_of(keys) == f]) >= 0)  # sorted keys of a field: buckets ascend
        for i in range(buckets):
            lo, hi = bucket_bounds(i, buckets)
            hx = hx_of(keys[b == i]).astype(np.int64)
            assert np.all((hx >= lo) & (hx < hi))
            for source in (1, 2, 5, 64):  # data bucketed another way: the overlapping source buckets hold them all
                assert set(bucket_of(keys[b == i], source)) <= set(source_buckets(i, buckets, source))


@pytest.mark.parametrize("decay", [1.0, 0.83])
@pytest.mark.parametrize("cap", [1, 7, 40])
def test_the_cap_search_over_buckets_keeps_exactly_the_single_table_top_keys(decay, cap):
    rng = np.random.default_rng(int(cap * 10 + decay * 100))
    n = 3000
    keys = np.unique((rng.integers(0, 4, n) << 56) | rng.integers(2, 1 << 56, n))
    field = field_of(keys).astype(np.int16)
    days = rng.integers(0, 3, (len(keys), 4))  # four days of small counts: many exact ties
    score = sum(days[:, k].astype(np.float64) * decay ** (3 - k) for k in range(4))
    admitted = rng.random(len(keys)) < 0.8
    want = admitted & _within_cap(field, keys, score, admitted, cap)

    buckets = 6
    b = bucket_of(keys, buckets)
    parts = [np.flatnonzero(b == i) for i in range(buckets)]  # each bucket's keys stay sorted
    bits = score_bits(score)
    per_field = np.bincount(field[admitted], minlength=4)
    search = CapSearch(cap=cap, admitted=per_field, buckets=buckets)
    rounds = 0
    while not search.done:
        search.absorb([cap_histograms(field=field[p], bits=bits[p], admitted=admitted[p], query=search.query(),
                                      shift=search.shift) for p in parts])  # fmt: skip
        rounds += 1
    assert rounds <= 5 and set(search.cuts) == {f for f in range(4) if per_field[f] > cap}
    got = np.zeros(len(keys), bool)
    for i, p in enumerate(parts):
        cuts = {f: (c.bits, c.take[i]) for f, c in search.cuts.items()}
        got[p] = cap_mask(field=field[p], bits=bits[p], admitted=admitted[p], cuts=cuts)
    np.testing.assert_array_equal(got, want)


def test_the_single_table_update_still_matches_the_reference():
    """`update_vocab` (whole tables, used by the pure tests) runs the same per-key steps as the buckets."""
    rng = np.random.default_rng(5)
    frames = {d: count_keys(pd.DataFrame({c: rng.choice([f"v{i}" for i in range(30)] + [None], 400)
                                          for c in ("A", "B")}), ["A", "B"]) for d in date_range("2026-01-01", "2026-01-04")}  # fmt: skip
    cfg = VocabConfig(min_count=3, ttl_days=1, decay=0.9, max_keys_per_field=10)
    prev = ref_prev = None
    for d in frames:
        window = {k: v for k, v in frames.items() if k <= d and k > shift_date(d, -2)}
        got = update_vocab(date=d, window=window_counts(window, date=d, decay=0.9), previous=prev, config=cfg,
                           fields=["A", "B"])  # fmt: skip
        want = reference_update(date=d, window=reference_window_counts(window, date=d, decay=0.9), previous=ref_prev,
                                config=cfg, fields=["A", "B"])  # fmt: skip
        pd.testing.assert_frame_equal(got.vocab, want[0], check_exact=True, check_dtype=False)
        pd.testing.assert_frame_equal(got.evicted, want[1], check_exact=True, check_dtype=False)
        prev, ref_prev = got.vocab, want[0]


def test_the_bucket_count_follows_the_data_unless_configured():
    assert auto_buckets(0) == 1 and auto_buckets(MERGE_ROWS_PER_BUCKET) == 1
    assert auto_buckets(MERGE_ROWS_PER_BUCKET + 1) == 2 and auto_buckets(30 * MERGE_ROWS_PER_BUCKET) == 32
    assert VocabConfig(merge_buckets=7).merge_buckets == 7
    with pytest.raises(ValueError, match=r"vocab.merge_buckets must be in \[0, 65536\]"):
        VocabConfig(merge_buckets=-1)
