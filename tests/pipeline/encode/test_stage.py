"""Encoding: log-transformed dense values, admitted/OOV/missing keys, a time-ordered train/eval split."""

import shutil

import numpy as np
import pandas as pd
import pytest
from fsspec.implementations.local import LocalFileSystem

from pipeline.config import EncodeConfig, IngestConfig, InputConfig, VocabConfig
from pipeline.encode.frame import encode_frame
from pipeline.encode.keys import feature_keys, missing_key, oov_key
from pipeline.encode.split import eval_size, positional_split, ts_threshold
from pipeline.encode.stage import encode_date
from pipeline.ingest.parse import parse_chunk
from pipeline.ingest.stage import ingest_date
from pipeline.schema import AVAZU, CRITEO
from pipeline.vocab.stage import build_vocab
from storage.features_manifest import read_features_manifest
from storage.io.fsio import SUCCESS
from storage.io.layout import Layout


def one_row(**cats) -> pd.DataFrame:
    line = "\t".join(["1", "260.0", "-3", "", *["0"] * 10, *[cats.get(f"C{j + 1}", "") for j in range(26)]])
    return parse_chunk(line.encode(), schema=CRITEO, file="t").events


def test_dense_values_are_log1p_of_the_non_negative_part_and_missing_is_zero():
    f = encode_frame(one_row(), CRITEO, np.array([], dtype=np.int64))
    assert f["label"].dtype == np.float32 and f["label"].iloc[0] == 1.0
    assert f["d_0"].iloc[0] == pytest.approx(np.log1p(260.0)) and f["d_1"].iloc[0] == 0 and f["d_2"].iloc[0] == 0
    assert f[[f"d_{i}" for i in range(13)]].dtypes.eq(np.float32).all()


def test_keys_are_admitted_keys_else_the_field_oov_key_else_the_missing_key():
    admitted = np.sort(feature_keys(0, ["known"]))
    f = encode_frame(one_row(C1="known", C2="known"), CRITEO, admitted)
    assert f["k_0"].iloc[0] == admitted[0]
    assert f["k_1"].iloc[0] == oov_key(1)  # same text, other field: not admitted
    assert f["k_2"].iloc[0] == missing_key(2)
    assert f[[f"k_{j}" for j in range(26)]].dtypes.eq(np.int64).all()


def test_raw_keys_are_every_values_own_key_whether_admitted_or_not():
    admitted = np.sort(feature_keys(0, ["known"]))
    f = encode_frame(one_row(C1="known", C2="rare"), CRITEO, admitted, raw_keys=True)
    assert f["r_0"].iloc[0] == f["k_0"].iloc[0] == admitted[0]
    assert f["k_1"].iloc[0] == oov_key(1) and f["r_1"].iloc[0] == feature_keys(1, ["rare"])[0]
    assert f["r_2"].iloc[0] == f["k_2"].iloc[0] == missing_key(2)
    assert list(f.columns[-26:]) == [f"r_{j}" for j in range(26)]
    assert not any(c.startswith("r_") for c in encode_frame(one_row(), CRITEO, admitted).columns)  # off: as before


def test_split_sizes_hold_out_the_rounded_eval_fraction():
    assert eval_size(1000, 0.1) == 100 and eval_size(2, 0.1) == 1 and eval_size(3, 0.9) == 2
    assert positional_split([1500, 1500, 1000], 3600) == [1500, 1500, 600]


def test_ts_threshold_takes_whole_hours_then_the_earliest_rows_of_the_last_one():
    counts = pd.Series({100: 5, 300: 4, 200: 3})
    assert ts_threshold(counts, 5) == (100, 5) and ts_threshold(counts, 7) == (200, 2)


@pytest.fixture(scope="module")
def vocab_root(tmp_path_factory, raw_days, client):
    root = tmp_path_factory.mktemp("encode-root")
    shutil.copytree(raw_days.path, root / "raw")
    date = raw_days.dates[0]
    ingest_date(
        date, layout=Layout(str(root)), input=InputConfig(), ingest=IngestConfig(rows_per_partition=1500), client=client
    )
    build_vocab(date, layout=Layout(str(root)), vocab=VocabConfig(min_count=5), fmt="criteo", client=client)
    return root, date


def test_a_day_is_encoded_into_time_ordered_train_and_eval(vocab_root, client):
    root, date = vocab_root
    r = encode_date(date, layout=Layout(str(root)), encode=EncodeConfig(eval_fraction=0.3), fmt="criteo", client=client)
    assert (r.rows_train, r.rows_eval, r.skipped) == (2800, 1200, False)
    day = root / "features" / f"date={date}"
    train, evals = pd.read_parquet(day / "train"), pd.read_parquet(day / "eval")
    assert (len(train), len(evals)) == (2800, 1200)
    events = pd.read_parquet(root / "events" / f"date={date}").sort_values("order", ignore_index=True)
    assert train["label"].tolist() == events["label"].iloc[:2800].astype(np.float32).tolist()
    assert sorted(p.name for p in (day / "train").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    manifest = pd.read_json(day / SUCCESS, typ="series")
    assert manifest["key_columns"] == [f"k_{j}" for j in range(26)] and manifest["dense_columns"][0] == "d_0"
    assert manifest["fields"] == list(CRITEO.categorical) and manifest["vocab_date"] == date
    key_counts = pd.read_parquet(day / "key_counts.parquet")
    assert key_counts["count"].sum() == 2800 * 26 and key_counts["count"].is_monotonic_decreasing
    assert set(key_counts["key"]) == set(np.unique(train[[f"k_{j}" for j in range(26)]].to_numpy()))
    again = encode_date(
        date, layout=Layout(str(root)), encode=EncodeConfig(eval_fraction=0.3), fmt="criteo", client=client
    )
    assert again.skipped  # the rerun of a day with its own keys (`raw_keys`) is the same encoding: skipped
    # a day of 4,000 rows is under encode.raw_keys_up_to: its rows carry every value's own key too
    assert [c for c in train.columns if c.startswith("r_")] == [f"r_{j}" for j in range(26)] and manifest["raw_keys"]


def test_raw_keys_are_written_beside_the_keys_on_small_days_and_a_change_encodes_again(vocab_root, client, tmp_path):
    root, date = vocab_root
    shutil.copytree(root / "events", tmp_path / "events")
    shutil.copytree(root / "vocab", tmp_path / "vocab")
    layout = Layout(str(tmp_path))
    day = tmp_path / "features" / f"date={date}"

    def encode(**kw):
        r = encode_date(date, layout=layout, encode=EncodeConfig(eval_fraction=0.3, **kw), fmt="criteo", client=client)
        manifest = read_features_manifest(LocalFileSystem(), str(day))
        return r, pd.read_parquet(day / "train"), manifest

    plain, train, manifest = encode(raw_keys_up_to=3_999)  # a day of 4,000 rows: more than the threshold
    assert not plain.skipped and not manifest.raw_keys and not any(c.startswith("r_") for c in train.columns)
    r, train, manifest = encode(raw_keys_up_to=4_000)
    assert not r.skipped and manifest.raw_keys  # another encoding of the same day: not the features on disk
    keys, own = train[[f"k_{j}" for j in range(26)]].to_numpy(), train[[f"r_{j}" for j in range(26)]].to_numpy()
    admitted = own == keys
    assert admitted.any() and not admitted.all()  # the OOV key where a value is not admitted, its own key in r_j
    assert ((keys == own) | (keys & ((1 << 56) - 1) == 0)).all()
    # the same encoding asked for another way: every day (raw_keys), or under the default threshold
    assert encode(raw_keys=True, raw_keys_up_to=0)[0].skipped and encode()[0].skipped
    assert not encode(raw_keys_up_to=0)[0].skipped  # and back


def test_encode_needs_the_vocabulary(vocab_root, client, tmp_path):
    root, date = vocab_root
    shutil.copytree(root / "events", tmp_path / "events")
    with pytest.raises(FileNotFoundError, match="run build_vocab first"):
        encode_date(date, layout=Layout(str(tmp_path)), encode=EncodeConfig(), fmt="criteo", client=client)


def test_avazu_is_split_by_hour_then_order(tmp_path, client):
    header = ",".join(AVAZU.columns)
    hours = ["14102103", "14102101", "14102102", "14102101"] * 5  # rows out of hour order
    lines = [header] + [",".join([str(i), str(i % 2), h, *[f"v{i % 3}"] * 21]) for i, h in enumerate(hours)]
    (tmp_path / "a.csv").write_text("\n".join(lines) + "\n")
    kw = {"layout": Layout(str(tmp_path / "root")), "client": client}
    ingest_date(
        "2014-10-21",
        input=InputConfig(url=str(tmp_path / "a.csv"), format="avazu"),
        ingest=IngestConfig(rows_per_partition=7),
        **kw,
    )
    build_vocab("2014-10-21", vocab=VocabConfig(), fmt="avazu", **kw)
    r = encode_date("2014-10-21", encode=EncodeConfig(eval_fraction=0.25), fmt="avazu", **kw)
    assert (r.rows_train, r.rows_eval) == (15, 5)
    events = pd.read_parquet(tmp_path / "root" / "events" / "date=2014-10-21")
    evals = pd.read_parquet(tmp_path / "root" / "features" / "date=2014-10-21" / "eval")
    assert evals.shape[1] == 1 + 21 + 21 and len(evals) == 5  # no dense columns for Avazu; k_j and r_j
    hour3 = events[events["ts"] == events["ts"].max()]
    assert len(hour3) == 5 and evals["label"].tolist() == hour3.sort_values("order")["label"].astype(float).tolist()


def test_a_replayed_day_keeps_copies_of_train_rows_out_of_eval(tmp_path, raw_days, client):
    """The day's file three times over (an upstream replay): no eval row is a copy of a train row."""
    import gzip

    day = raw_days.dates[0]
    lines = gzip.decompress((raw_days.path / f"day_{day}.tsv.gz").read_bytes())
    (tmp_path / f"replay_{day}.tsv").write_bytes(lines * 3)
    kw = {"layout": Layout(str(tmp_path / "root")), "client": client}
    ingest_date(
        day,
        input=InputConfig(url=str(tmp_path / "replay_{date}.tsv")),
        ingest=IngestConfig(rows_per_partition=1500),
        **kw,
    )
    build_vocab(day, vocab=VocabConfig(min_count=5), fmt="criteo", **kw)
    r = encode_date(day, encode=EncodeConfig(eval_fraction=0.2), fmt="criteo", **kw)
    rows = 3 * 4000
    assert r.rows_train == rows - eval_size(rows, 0.2)
    assert r.eval_copies_dropped == eval_size(rows, 0.2) and r.rows_eval == 0  # the last fifth copies the first
    assert r.duplicate_share > 0.6  # two of three rows copy another (a few generated rows repeat anyway)
    features = tmp_path / "root" / "features" / f"date={day}"
    assert not list((features / "eval").glob("*.parquet"))


def test_a_day_without_copies_keeps_every_eval_row(vocab_root, client):
    root, date = vocab_root
    r = encode_date(
        date, layout=Layout(str(root)), encode=EncodeConfig(eval_fraction=0.25), fmt="criteo", client=client, force=True
    )
    assert r.rows_eval == 1000 and r.eval_copies_dropped == 0 and r.duplicate_share < 0.01
