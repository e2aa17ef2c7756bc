"""Vocabularies: windowed counts, sticky admission at min_count, eviction after ttl_days unseen."""

import shutil

import numpy as np
import pandas as pd
import pytest

from pipeline.config import IngestConfig, InputConfig, VocabConfig
from pipeline.ingest import ingest_date
from pipeline.keys import feature_keys
from pipeline.schema import CRITEO
from pipeline.vocab import count_keys, merge_counts, update_vocab, window_counts
from pipeline.vocab_stage import build_vocab, load_admitted, load_evicted
from storage.io.layout import Layout


def counts(**key_count: int) -> pd.DataFrame:
    """Day counts of field-0 values named by the keyword, e.g. counts(a=2, b=1)."""
    frame = pd.DataFrame({"v": [k for k, n in key_count.items() for _ in range(n)]})
    return count_keys(frame, ["v"])


def key(value: str) -> int:
    return int(feature_keys(0, [value])[0])


def step(date, window: dict, previous, **config):
    return update_vocab(date=date, window=window_counts(window), previous=previous, config=VocabConfig(**config))


# ---- pure logic -------------------------------------------------------------------------------
def test_count_keys_skips_missing_values_and_counts_each_field_apart():
    c = count_keys(pd.DataFrame({"a": ["x", "x", None, ""], "b": ["x", "y", "y", "y"]}), ["a", "b"])
    assert dict(zip(c["key"], c["count"], strict=True)) == {
        key("x"): 2,
        int(feature_keys(1, ["x"])[0]): 1,
        int(feature_keys(1, ["y"])[0]): 3,
    }
    assert sorted(c["field"].tolist()) == [0, 1, 1]


def test_partition_counts_merge_into_the_day_counts():
    assert merge_counts([counts(a=1, b=2), counts(a=3)]).equals(counts(a=4, b=2))


def test_window_sums_days_and_records_first_and_last_date():
    w = window_counts({"2026-01-02": counts(a=1), "2026-01-01": counts(a=2, b=1), "2026-01-03": counts(b=5)})
    rows = w.set_index("key")
    assert rows.loc[key("a"), ["count", "first_date", "last_date"]].tolist() == [3, "2026-01-01", "2026-01-02"]
    assert rows.loc[key("b"), ["count", "first_date", "last_date"]].tolist() == [6, "2026-01-01", "2026-01-03"]


def test_a_key_is_admitted_when_its_windowed_count_reaches_min_count():
    v = step("2026-01-01", {"2026-01-01": counts(a=2, b=1)}, None, min_count=2).vocab.set_index("key")
    assert v.loc[key("a"), "admitted"] and not v.loc[key("b"), "admitted"]
    v2 = step("2026-01-02", {"2026-01-01": counts(a=2, b=1), "2026-01-02": counts(b=1)}, v.reset_index(), min_count=2)
    assert v2.vocab.set_index("key").loc[key("b"), "admitted"]  # 1 + 1 over the window


def test_admission_is_sticky_until_the_key_is_unseen_for_more_than_ttl_days():
    cfg = {"min_count": 2, "window_days": 2, "ttl_days": 3}
    v = step("2026-01-01", {"2026-01-01": counts(a=2)}, None, **cfg).vocab
    for date in ("2026-01-02", "2026-01-03", "2026-01-04"):  # out of the window, within the TTL
        update = step(date, {}, v, **cfg)
        v = update.vocab
        assert v.set_index("key").loc[key("a"), "admitted"] and len(update.evicted) == 0
    update = step("2026-01-05", {}, v, **cfg)  # last seen 4 days ago > ttl_days
    assert update.evicted["key"].tolist() == [key("a")] and update.evicted["last_seen"].tolist() == ["2026-01-01"]
    assert key("a") not in update.vocab["key"].tolist()


def test_seen_again_before_the_ttl_keeps_a_key_and_updates_last_seen():
    cfg = {"min_count": 2, "window_days": 1, "ttl_days": 2}
    v = step("2026-01-01", {"2026-01-01": counts(a=2)}, None, **cfg).vocab
    v = step("2026-01-03", {"2026-01-03": counts(a=1)}, v, **cfg).vocab.set_index("key")
    assert v.loc[key("a"), ["admitted", "first_seen", "last_seen"]].tolist() == [True, "2026-01-01", "2026-01-03"]


def test_never_admitted_keys_are_forgotten_once_out_of_the_window():
    v = step("2026-01-01", {"2026-01-01": counts(b=1)}, None, min_count=2, window_days=1).vocab
    assert step("2026-01-02", {}, v, min_count=2, window_days=1).vocab.empty


# ---- the stage --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ingested(tmp_path_factory, raw_days, client):
    root = tmp_path_factory.mktemp("vocab-root")
    shutil.copytree(raw_days.path, root / "raw")
    for d in raw_days.dates:
        ingest_date(d, layout=Layout(str(root)), input=InputConfig(), ingest=IngestConfig(rows_per_partition=1500), client=client)
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


def test_per_field_min_count_overrides_the_global_one():
    frame = pd.DataFrame({"A": ["x", "x", "y"], "B": ["x", "x", "y"]})
    window = window_counts({"2026-01-01": count_keys(frame, ["A", "B"])})
    cfg = VocabConfig(min_count=2, min_count_per_field={"B": 3})
    v = update_vocab(date="2026-01-01", window=window, previous=None, config=cfg, fields=["A", "B"]).vocab
    assert v.loc[v["admitted"], "key"].tolist() == [key("x")]  # B's x (count 2) stays below 3
    with pytest.raises(ValueError, match="unknown fields"):
        update_vocab(date="2026-01-01", window=window, previous=None, config=cfg, fields=["A"])


def test_decay_weighs_older_days_less():
    days = {"2026-01-01": counts(a=4), "2026-01-03": counts(b=2)}
    w = window_counts(days, date="2026-01-03", decay=0.5).set_index("key")
    assert w.loc[key("a"), ["count", "score"]].tolist() == [4, 1.0] and w.loc[key("b"), "score"] == 2.0
    v = update_vocab(date="2026-01-03", window=w.reset_index(), previous=None, config=VocabConfig(min_count=2, decay=0.5))
    assert v.vocab.set_index("key")["admitted"].to_dict() == {key("a"): False, key("b"): True}


def test_the_per_field_cap_keeps_the_highest_scores_and_evicts_the_rest():
    first = step("2026-01-01", {"2026-01-01": counts(a=5, b=4, c=3)}, None, min_count=1)
    assert first.vocab["admitted"].all()
    capped = step("2026-01-02", {"2026-01-01": counts(a=5, b=4, c=3), "2026-01-02": counts(c=9)}, first.vocab,
                  min_count=1, max_keys_per_field=2)  # fmt: skip
    admitted = set(capped.vocab.loc[capped.vocab["admitted"], "key"])
    assert admitted == {key("c"), key("a")} and capped.evicted["key"].tolist() == [key("b")]
