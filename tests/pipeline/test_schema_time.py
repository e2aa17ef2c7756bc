"""Time features: categorical fields a schema derives from its timestamp (`time_features`), written by the parser
so that ingest, the later stages and scoring (`FeatureSpec`, the same parse path) all have them (issue 52)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.config import EncodeConfig, IngestConfig, InputConfig, VocabConfig
from pipeline.encode.feature_spec import FeatureSpec
from pipeline.encode.keys import feature_keys
from pipeline.encode.stage import encode_date
from pipeline.ingest.parse import parse_chunk
from pipeline.ingest.stage import ingest_date
from pipeline.schema import CRITEO, load_schema_file, schema_from_dict
from pipeline.vocab.stage import build_vocab
from storage.io.layout import Layout

DATE = "2026-03-01"  # a Sunday
SPEC = {
    "separator": ",",
    "columns": ["ts", "clicked", "app", "attributed"],
    "label": "clicked",
    "timestamp": {"column": "ts", "format": "%Y-%m-%d %H:%M:%S"},
    "categorical": ["app"],
    "time_features": ["hour_of_day", "day_of_week"],
}


def test_time_features_follow_the_categorical_fields_and_make_the_timestamp_a_model_input():
    s = schema_from_dict(SPEC, default_name="talk")
    assert s.categorical == ("app", "hour_of_day", "day_of_week") and s.time_features == ("hour_of_day", "day_of_week")
    assert s.reads_timestamp and s.request_columns == ("ts", "app")  # the raw columns a scoring request needs
    plain = schema_from_dict({k: v for k, v in SPEC.items() if k != "time_features"})
    assert not plain.reads_timestamp and plain.request_columns == ("app",)
    assert schema_from_dict({**SPEC, "categorical": ["day_of_week", "app"]}).categorical == (
        "day_of_week",
        "app",
        "hour_of_day",
    )  # listed in categorical: that field index


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"time_features": ["minute"]}, r"unknown time feature 'minute'; known: hour_of_day, day_of_week"),
        ({"timestamp": None}, r"time feature 'hour_of_day' needs a timestamp column"),
        ({"columns": ["ts", "clicked", "app", "hour_of_day"]}, r"'hour_of_day' must be .* not a column name"),
    ],
)
def test_a_time_feature_the_schema_cannot_derive_is_an_error_naming_it(change, message):
    with pytest.raises(ValueError, match=message):
        schema_from_dict({**SPEC, **change}, where="talk.yaml")


def test_the_parser_derives_hour_and_weekday_from_the_timestamp_as_written():
    s = schema_from_dict(SPEC)
    lines = ["2026-03-01 00:00:07,0,a,", "2026-03-01 23:59:59,1,b,x", "2026-03-02 13:00:00,0,a,"]
    p = parse_chunk(("\n".join(lines) + "\n").encode(), schema=s, file="f.csv")
    assert p.events["hour_of_day"].tolist() == ["0", "23", "13"]
    assert p.events["day_of_week"].tolist() == ["sun", "sun", "mon"]
    unix = schema_from_dict({**SPEC, "timestamp": {"column": "ts", "format": "unix"}})
    p = parse_chunk(b"0,0,a,\n1772409600,1,a,\n", schema=unix, file="f.csv")  # 1970-01-01 (Thursday), 2026-03-02
    assert p.events["day_of_week"].tolist() == ["thu", "mon"] and p.events["hour_of_day"].tolist() == ["0", "0"]


def test_the_digest_changes_with_what_the_schema_says_not_with_fields_left_at_their_defaults():
    assert schema_from_dict(SPEC).digest() != schema_from_dict({**SPEC, "time_features": ["hour_of_day"]}).digest()
    assert CRITEO.digest() == "b5d9f3c5dbd0b866"  # the built-in schemas keep theirs as fields are added


def test_time_features_are_fields_of_vocab_encode_and_scoring_alike(tmp_path, client):
    schema_file = tmp_path / "talk.yaml"
    schema_file.write_text(
        "separator: ','\ncolumns: [ts, clicked, app, attributed]\nlabel: clicked\ncategorical: [app]\n"
        "timestamp: {column: ts, format: '%Y-%m-%d %H:%M:%S'}\ntime_features: [hour_of_day, day_of_week]\n"
    )
    lines = [f"{DATE} {i % 24:02d}:00:{i % 60:02d},{int(i % 9 == 0)},a{i % 5}," for i in range(480)]
    (tmp_path / "talk.csv").write_text("\n".join(lines) + "\n")
    fmt, kw = str(schema_file), {"layout": Layout(str(tmp_path / "root")), "client": client}
    ingest_date(DATE, input=InputConfig(url=str(tmp_path / "talk.csv"), format=fmt), ingest=IngestConfig(), **kw)
    v = build_vocab(DATE, vocab=VocabConfig(min_count=1), fmt=fmt, **kw)
    assert v.admitted == 5 + 24 + 1  # apps, hours, one weekday
    encode_date(DATE, encode=EncodeConfig(), fmt=fmt, **kw)
    feats = pd.concat(
        pd.read_parquet(tmp_path / "root" / "features" / f"date={DATE}" / part) for part in ("train", "eval")
    )
    assert set(feats["k_1"]) == set(feature_keys(1, [str(h) for h in range(24)]).tolist())
    assert set(feats["k_2"]) == {int(feature_keys(2, ["sun"])[0])}

    spec = FeatureSpec(schema=load_schema_file(fmt), admitted=np.sort(feature_keys(1, ["7"])))
    scored = spec.parse_lines([f"{DATE} 07:30:00,0,a1,"]).features
    assert scored["k_1"].tolist() == feature_keys(1, ["7"]).tolist()  # the request's hour, admitted
