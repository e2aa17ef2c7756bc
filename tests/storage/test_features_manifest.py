"""storage.features_manifest: the features manifest round-trips, today's manifests (no version, or only the
columns) read as version 1, unknown fields are ignored, a newer version is refused saying what to do; the
column-name rule reads back what it writes."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from storage.features_manifest import (
    FEATURES_FORMAT,
    Duplicates,
    FeaturesManifest,
    FormatError,
    PartRows,
    bag_column,
    bag_key_column,
    column_index,
    columns_of,
    dense_column,
    key_column,
    read_features_manifest,
)
from storage.io import codec, fsio
from tests.helpers.formats import newer, sample

FULL = FeaturesManifest(
    date="2026-01-04",
    format="criteo",
    rows_train=900,
    rows_eval=99,
    eval_copies_dropped=1,
    duplicates=Duplicates(share=0.01, sampled_rows=999, sample_bits=0),
    dense_columns=("d_0", "d_1"),
    key_columns=("k_0", "k_1"),
    bag_columns=("bag_1",),
    fields=("C1", "C2"),
    dense_fields=("I1", "I2"),
    vocab_date="2026-01-04",
    train_parts=("part-00000",),
    eval_parts=("part-00000",),
    train_part_rows=(PartRows("part-00000", 900),),
    eval_part_rows=(PartRows("part-00000", 99),),
    distinct_train_keys=123,
    events_run_id="e1",
    vocab_run_id="v1",
    eval_fraction=0.1,
    run_id="r1",
    code_version="abc",
)

# what pipeline.encode.stage wrote before the manifest had a version (written by the code of 2026-12-02)
TODAY = sample("features-manifest-v1.json")


def test_a_manifest_round_trips_through_json() -> None:
    data = json.loads(json.dumps(FULL.to_dict()))
    assert data["manifest_format"] == "ctr-pipeline-features/1" and "data" not in data
    assert FeaturesManifest.from_dict(data, where="m.json") == FULL


def test_todays_manifest_without_a_version_reads_as_version_1() -> None:
    m = FeaturesManifest.from_dict(TODAY, where="m.json")
    assert m.manifest_format == FEATURES_FORMAT.tag and (m.rows_train, m.rows_eval) == (1800, 200)
    assert m.key_columns == tuple(f"k_{j}" for j in range(26)) and m.dense_columns == tuple(f"d_{i}" for i in range(13))
    assert m.eval_part_rows == (PartRows("part-00001.parquet", 200),) and m.bag_columns == () and m.format == "criteo"
    assert m.duplicates == Duplicates(share=0.0, sampled_rows=2000, sample_bits=0) and m.eval_fraction == 0.1
    # written back with the fields added since at their defaults (`raw_keys`: no own keys r_<j>)
    assert json.loads(json.dumps(m.to_dict())) == {
        **TODAY,
        "manifest_format": "ctr-pipeline-features/1",
        "raw_keys": False,
    }
    assert "raw_keys" not in m.source  # its encoding is the one of before the key: not encoded again


def test_a_hand_made_manifest_with_only_columns_reads() -> None:
    m = FeaturesManifest.from_dict({"dense_columns": ["d_0"], "key_columns": ["k_0", "k_1"]}, where="m.json")
    assert m.rows_train == 0 and m.bag_columns is None and m.date is None and m.eval_part_rows == ()


def test_unknown_fields_are_ignored() -> None:
    m = FeaturesManifest.from_dict(newer(TODAY, duplicates="retired"), where="m.json")
    assert m == FeaturesManifest.from_dict(TODAY, where="m.json")


def test_a_newer_version_is_refused_naming_the_file_and_what_to_do() -> None:
    with pytest.raises(
        FormatError,
        match=r"/f/_SUCCESS\.json has format 'ctr-pipeline-features/2', written by a "
        r"newer ctr-pipeline.*upgrade ctr-pipeline.*encode stage.*--force",
    ):
        FeaturesManifest.from_dict({**TODAY, "manifest_format": "ctr-pipeline-features/2"}, where="/f/_SUCCESS.json")


def test_another_files_format_and_a_wrong_type_are_refused() -> None:
    with pytest.raises(FormatError, match="not a ctr-pipeline-features file"):
        FeaturesManifest.from_dict({"manifest_format": "ctr-pipeline-model/2"}, where="m.json")
    with pytest.raises(codec.ConfigError, match="rows_train must be an integer"):
        FeaturesManifest.from_dict({**TODAY, "rows_train": "many"}, where="m.json")
    with pytest.raises(codec.ConfigError, match=r"key columns \['C1'\] are not named k_<index>"):
        FeaturesManifest.from_dict({**TODAY, "key_columns": ["C1"]}, where="m.json")


def test_read_features_manifest_reads_the_committed_one(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    assert read_features_manifest(fs, str(tmp_path)) is None  # not committed
    fsio.write_json(fs, str(tmp_path / fsio.SUCCESS), FULL.to_dict())
    m = read_features_manifest(fs, str(tmp_path))
    assert m == FULL and m.data_dir(str(tmp_path)) == str(tmp_path)
    assert (
        FeaturesManifest.from_dict({**TODAY, "data": "v-0123456789ab"}, where="m").data_dir("s3://b/f")
        == "s3://b/f/v-0123456789ab"
    )


def test_the_column_rule_reads_back_what_it_writes() -> None:
    for i in (0, 7, 12, 103):
        assert column_index(dense_column(i), "dense") == column_index(key_column(i), "key") == i
        assert column_index(bag_column(i), "bag") == i and bag_key_column(bag_column(i)) == key_column(i)
    assert column_index("k_1", "dense") is None and column_index("label", "key") is None
    assert column_index("k_01x", "key") is None
    names = ["label", "k_10", "d_1", "k_2", "bag_10", "d_0", "k_0"]
    assert columns_of(names, "key") == ("k_0", "k_2", "k_10")  # by index, not by string
    assert columns_of(names, "dense") == ("d_0", "d_1") and columns_of(names, "bag") == ("bag_10",)
    with pytest.raises(ValueError, match="not a bag column"):
        bag_key_column("k_1")
