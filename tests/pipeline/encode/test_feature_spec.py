"""The feature spec scores a raw line through the ingest parser and the encode stage: one feature path."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.encode.feature_spec import FeatureSpec
from pipeline.encode.frame import encode_frame
from pipeline.encode.keys import feature_keys, oov_key
from pipeline.ingest.parse import read_log_file
from pipeline.schema import get_schema

CRITEO = get_schema("criteo")


def _spec_of(events: pd.DataFrame) -> FeatureSpec:
    keys = np.concatenate([feature_keys(j, events[c]) for j, c in enumerate(CRITEO.categorical)])
    uniq, counts = np.unique(keys, return_counts=True)
    return FeatureSpec(
        schema=CRITEO, admitted=uniq[counts >= 2], bag_pooling="mean", dense_buckets=16, dense_bucket_max=12.0
    )


def test_lines_become_exactly_what_ingest_and_encode_make_of_the_same_file(shared_data, tmp_path):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_text().splitlines()[:2000]
    lines[5] = "2\t" + lines[5].split("\t", 1)[1]  # bad label
    lines[9] = lines[9].replace("\t", ",")  # wrong format: one field
    lines[11] = "1\tnot-a-number" + lines[11][lines[11].index("\t", 2) :]
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(lines) + "\n")
    events, quarantine = read_log_file(str(path), "criteo")
    spec = _spec_of(events)

    parsed = spec.parse_lines(lines)
    want = encode_frame(events, CRITEO, spec.admitted)
    pd.testing.assert_frame_equal(parsed.features.reset_index(drop=True), want)
    assert parsed.index.tolist() == (events["order"].to_numpy() - 1).tolist()  # file line numbers are 1-based
    assert parsed.errors == [
        (int(line) - 1, reason) for line, reason in zip(quarantine["line"], quarantine["reason"], strict=True)
    ]
    assert [i for i, _ in parsed.errors] == [5, 9, 11]
    assert parsed.errors[0][1].startswith("bad label") and parsed.errors[1][1].startswith("wrong field count")


def test_rows_of_named_fields_take_the_same_path_as_lines(shared_data):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_text().splitlines()[:300]
    events, _ = read_log_file(str(shared_data / "criteo" / "train_head_10k.tsv"), "criteo")
    spec = _spec_of(events.iloc[:300])
    rows = []
    for line in lines:
        values = line.split("\t") + [""] * (len(CRITEO.columns) - len(line.split("\t")))
        row = {
            c: (None if v == "" else int(v) if c in CRITEO.dense else v)
            for c, v in zip(CRITEO.columns, values, strict=True)
        }
        del row["label"]  # not scored: may be left out
        rows.append(row)
    rows.insert(3, {"C1": "x", "bogus": 1})
    rows.insert(7, ["not", "an", "object"])
    rows.insert(9, {"C2": "a\tb"})
    by_rows, by_lines = spec.parse_rows(rows), spec.parse_lines(lines)
    cols = [c for c in by_lines.features.columns if c != "label"]
    pd.testing.assert_frame_equal(by_rows.features[cols], by_lines.features[cols])
    assert [i for i, _ in by_rows.errors] == [3, 7, 9]
    assert "unknown fields ['bogus']" in by_rows.errors[0][1] and "not an object" in by_rows.errors[1][1]
    assert "separator" in by_rows.errors[2][1]
    assert 3 not in by_rows.index and by_rows.index.size == 300


def test_a_line_with_a_line_break_is_refused_and_the_others_scored():
    spec = FeatureSpec(schema=CRITEO, admitted=np.zeros(0, np.int64))
    good = "0\t" + "\t".join(["1"] * 13) + "\t" + "\t".join(["a"] * 26)
    parsed = spec.parse_lines([good, good + "\n" + good, "", good])
    assert parsed.index.tolist() == [0, 3]
    assert parsed.errors[0] == (1, "line break in line: send one log line per entry")
    assert parsed.errors[1][0] == 2 and parsed.errors[1][1].startswith("bad label")  # what ingest says of it
    assert (parsed.features["k_0"] == oov_key(0)).all()  # nothing admitted: every value is OOV


def test_the_spec_round_trips_through_its_json_file():
    schema = get_schema("avazu")
    spec = FeatureSpec(schema=schema, admitted=np.array([3, 9, 20], np.int64), bag_pooling="sum", dense_buckets=0)
    data = json.loads(json.dumps(spec.to_dict()))
    back = FeatureSpec.from_dict(data, np.array([3, 9, 20], np.int64))
    assert back.schema == schema and back.bag_pooling == "sum" and back.admitted.tolist() == [3, 9, 20]
    assert data["field_order"] == list(schema.categorical) and data["admitted_keys"] == 3
    assert "raw_keys" not in data and not back.raw_keys  # as a spec of before the key
    raw = FeatureSpec(schema=schema, admitted=np.array([3], np.int64), raw_keys=True)
    assert FeatureSpec.from_dict(json.loads(json.dumps(raw.to_dict())), raw.admitted).raw_keys
    assert "r_0" in raw.parse_lines([]).features.columns
    with pytest.raises(ValueError, match="admitted keys"):
        FeatureSpec.from_dict(data, np.array([3], np.int64))
    with pytest.raises(ValueError, match="sorted"):
        FeatureSpec(schema=schema, admitted=np.array([9, 3], np.int64))
