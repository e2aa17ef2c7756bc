"""The vocab stage: the committed vocabulary equals the single-table reference whatever the buckets, merge
mode or history; reruns are skipped; the report is written per date.

`tests.helpers.vocab_reference` is the vocabulary code as it was before the
merge was distributed: every committed table, count, date, evicted key and
report number of the stage must equal it, including which keys win a tie at
the per-field cap.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import IngestConfig, InputConfig, VocabConfig
from pipeline.encode.keys import feature_keys
from pipeline.ingest.stage import ingest_date
from pipeline.schema import CRITEO
from pipeline.vocab.stage import build_vocab, load_admitted, load_evicted, load_report
from storage.io.dates import date_range
from storage.io.layout import Layout
from tests.helpers.vocab_reference import Reference

FIELDS = list(CRITEO.categorical)


# ---- events: small value domains, so counts tie and keys come and go --------------------------------
def write_events(root: Path, date: str, *, seed: int, rows: int = 1200, parts: int = 2) -> None:
    rng = np.random.default_rng(seed)
    out = root / "events" / f"date={date}"
    out.mkdir(parents=True, exist_ok=True)
    schema = CRITEO.events_schema()
    names = []
    for p, chunk in enumerate(np.array_split(np.arange(rows), parts)):
        n = len(chunk)
        cols = {
            "label": pa.array(rng.integers(0, 2, n).astype(np.int8)),
            "ts": pa.nulls(n, pa.int64()),
            "order": pa.array(chunk.astype(np.int64)),
        }
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
    (out / "_SUCCESS.json").write_text(
        json.dumps(
            {"date": date, "format": "criteo", "rows_written": rows, "parts": names, "run_id": f"events-{date}-{seed}"}
        )
    )


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
    pd.testing.assert_frame_equal(
        evicted.reset_index(drop=True),
        want_evicted.reset_index(drop=True),
        check_exact=True,
        check_dtype=False,
        obj=f"evicted {date}",
    )
    assert manifest["per_field"] == want_stats
    report = load_report(Layout(str(root)), date).drop(columns="date")
    assert report.to_dict("records") == want_stats
    assert manifest["admitted"] == int(want_vocab["admitted"].sum()) and manifest["evicted"] == len(want_evicted)
    assert manifest["seen"] == int((want_vocab["count"] > 0).sum())
    np.testing.assert_array_equal(
        load_admitted(Layout(str(root)), date), np.sort(want_vocab.loc[want_vocab["admitted"], "key"])
    )
    np.testing.assert_array_equal(load_evicted(Layout(str(root)), date), np.sort(want_evicted["key"]))
    assert manifest["day_fields"] == day_fields_reference(root, date, manifest)
    return manifest


def day_fields_reference(root: Path, date: str, manifest: dict) -> list[dict]:
    """Distinct keys of the day and the share of its rows the previous vocabulary had not admitted, per field."""
    day = pd.read_parquet(root / "vocab" / f"date={date}" / "day_counts.parquet")
    prev = manifest["previous_vocab_date"]
    known = set()
    if prev:
        before = pd.read_parquet(root / "vocab" / f"date={prev}" / "vocab.parquet")
        known = set(before.loc[before["admitted"], "key"].tolist())
    day = day.assign(known=day["key"].isin(known), field=day["key"].to_numpy() >> 56)
    out = []
    for j, name in enumerate(FIELDS):
        rows = day[day["field"] == j]
        new = int(rows.loc[~rows["known"], "count"].sum())
        out.append(
            {
                "field": name,
                "day_keys": int((rows["count"] > 0).sum()),
                "oov_rate_previous": round(new / manifest["day_rows"], 6),
            }
        )
    return out


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
    cfg = VocabConfig(
        window_days=3, min_count=2, ttl_days=2, max_keys_per_field=12, merge_buckets=5, min_count_per_field={"C7": 4}
    )
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
    vocab = pd.read_parquet(root / "vocab" / f"date={DATES[-1]}" / "vocab.parquet")
    assert vocab["first_seen"].map(type).eq(str).all()  # readers see plain strings, not categoricals


def test_decay_gaps_and_changing_bucket_counts_equal_the_reference(events_root, tmp_path, client):
    """Decayed float scores (window merge, several radix rounds for the cap), a missing day, B varying per day."""
    root = fresh_root(events_root, tmp_path)
    ref = Reference(root)
    plan = [(DATES[0], 3), (DATES[1], 8), (DATES[3], 1), (DATES[4], 6), (DATES[5], 0), (DATES[6], 7)]
    for d, buckets in plan:
        cfg = VocabConfig(
            window_days=4, min_count=2, ttl_days=3, decay=0.7, max_keys_per_field=9, merge_buckets=buckets
        )
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
    full = build_vocab(
        DATES[4], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client, force=True, incremental=False
    )
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


# ---- the stage on ingested days -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def ingested(tmp_path_factory, raw_days, client):
    root = tmp_path_factory.mktemp("vocab-root")
    shutil.copytree(raw_days.path, root / "raw")
    for d in raw_days.dates:
        ingest_date(
            d,
            layout=Layout(str(root)),
            input=InputConfig(),
            ingest=IngestConfig(rows_per_partition=1500),
            client=client,
        )
    return root, raw_days.dates


def day_keys(root, date) -> pd.Series:
    events = pd.read_parquet(root / "events" / f"date={date}")
    keys = np.concatenate([feature_keys(j, events[c]) for j, c in enumerate(CRITEO.categorical)])
    keys = keys[(keys & 0xFF_FFFF_FFFF_FFFF) != 1]  # drop missing keys
    return pd.Series(keys).value_counts()


def test_incremental_vocab_equals_counting_the_window_from_scratch(ingested, client, tmp_path):
    src, dates = ingested
    root = tmp_path / "root"
    shutil.copytree(src / "events", root / "events")
    cfg = VocabConfig(window_days=2, min_count=3, ttl_days=30)
    results = [build_vocab(d, layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client) for d in dates]
    vocab = pd.read_parquet(root / "vocab" / f"date={dates[-1]}" / "vocab.parquet").set_index("key")

    window = day_keys(root, dates[-2]).add(day_keys(root, dates[-1]), fill_value=0)
    in_window = vocab[vocab["count"] > 0]["count"]
    pd.testing.assert_series_equal(in_window.sort_index(), window.astype(np.int64).sort_index(), check_names=False)
    history = [set(day_keys(root, d).index) for d in dates]
    k = next(iter(history[0] & set(window.index)))
    assert vocab.loc[k, "first_seen"] == dates[0]
    ever_admitted = set()
    for d in dates:
        v = pd.read_parquet(root / "vocab" / f"date={d}" / "vocab.parquet")
        ever_admitted |= set(v.loc[v["admitted"], "key"])
    assert set(load_admitted(Layout(str(root)), dates[-1])) == ever_admitted  # sticky within the TTL
    assert results[-1].admitted == len(ever_admitted) and results[-1].evicted == 0
    f = results[-1].per_field[0]
    assert f["field"] == "C1" and 0.9 < f["coverage"] + f["oov_rate"] + f["missing_rate"] < 1.0 + 1e-6


def test_rerun_is_skipped_and_eviction_follows_the_ttl(ingested, client, tmp_path):
    src, dates = ingested
    root = tmp_path / "root"
    shutil.copytree(src / "events", root / "events")
    cfg = VocabConfig(window_days=1, min_count=1, ttl_days=2)
    first = build_vocab(dates[0], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
    assert build_vocab(dates[0], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client).skipped
    # no vocabularies for the days between: day 0's keys were last seen 3 days before day 3
    last = build_vocab(dates[3], layout=Layout(str(root)), vocab=cfg, fmt="criteo", client=client)
    evicted = set(load_evicted(Layout(str(root)), dates[3]))
    day0, day3 = set(day_keys(root, dates[0]).index), set(day_keys(root, dates[3]).index)
    assert first.admitted == len(day0) and evicted == day0 - day3 and last.evicted == len(evicted)
    assert set(load_admitted(Layout(str(root)), dates[3])) == day3


def test_vocab_needs_committed_events(tmp_path, client):
    with pytest.raises(FileNotFoundError, match="run ingest first"):
        build_vocab("2026-01-01", layout=Layout(str(tmp_path)), vocab=VocabConfig(), fmt="criteo", client=client)


def test_vocab_report_is_written_per_date(tmp_path, raw_days, client):
    date = raw_days.dates[0]
    shutil.copytree(raw_days.path, tmp_path / "raw")
    ingest_date(date, layout=Layout(str(tmp_path)), input=InputConfig(), ingest=IngestConfig(), client=client)
    cfg = VocabConfig(min_count=2, min_count_per_field={"C3": 1000}, max_keys_per_field=50)
    build_vocab(date, layout=Layout(str(tmp_path)), vocab=cfg, fmt="criteo", client=client)
    report = load_report(Layout(str(tmp_path)), date).set_index("field")
    assert list(report.index) == list(CRITEO.categorical) and report["admitted"].max() <= 50
    assert report.loc["C3", "admitted"] == 0 and (report["coverage"] + report["oov_rate"] <= 1 + 1e-9).all()
    assert len(load_admitted(Layout(str(tmp_path)), date)) == report["admitted"].sum()
    md = (tmp_path / "vocab" / f"date={date}" / "report.md").read_text()
    assert md.startswith(f"# Vocabulary {date}") and "| C3 |" in md and "max_keys_per_field=50" in md
    with pytest.raises(ValueError, match=r"unknown fields \['C99'\]"):
        build_vocab(
            date,
            layout=Layout(str(tmp_path)),
            vocab=VocabConfig(min_count_per_field={"C99": 2}),
            fmt="criteo",
            client=client,
            force=True,
        )
