"""Log schemas: the built-in formats, and YAML schema files (with multi-valued fields) through every stage."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.config import EncodeConfig, IngestConfig, InputConfig, VocabConfig
from pipeline.encode.keys import feature_keys, missing_key
from pipeline.encode.stage import encode_date
from pipeline.ingest.stage import ingest_date, read_quarantine
from pipeline.schema import get_schema
from pipeline.vocab.stage import build_vocab
from storage.io.layout import Layout

DATE = "2026-01-01"

SHOP_SCHEMA = """
name: shop
separator: ";"
header: true
columns: [ts, clicked, price, prior, site, tags]
label: {column: clicked, positive: ["yes"], negative: ["no"]}
timestamp: {column: ts, format: unix}
integer: [price]
float: [prior]
categorical: [site]
multi_valued: {tags: "|"}
"""


def shop_rows(n: int, day0: int) -> list[str]:
    rng = np.random.default_rng(0)
    rows = ["ts;clicked;price;prior;site;tags"]
    for i in range(n):
        tags = "|".join(f"t{t}" for t in rng.choice(6, size=int(rng.integers(0, 4)), replace=False))
        rows.append(f"{day0 + i * 7};{'yes' if i % 3 == 0 else 'no'};{i % 50};{i / n:.3f};s{i % 4};{tags}")
    return rows


def test_a_yaml_schema_file_with_a_multi_valued_field_runs_through_all_stages(tmp_path, client):
    schema_path = tmp_path / "shop.yaml"
    schema_path.write_text(SHOP_SCHEMA)
    day0 = int(np.datetime64(DATE, "s").astype(np.int64))
    rows = shop_rows(600, day0)
    rows[5] = rows[5].replace(";no;", ";maybe;")  # a bad label
    (tmp_path / "shop.csv").write_text("\r\n".join(rows) + "\r\n")
    fmt = str(schema_path)
    inp = InputConfig(url=str(tmp_path / "shop.csv"), format=fmt)
    kw = {"layout": Layout(str(tmp_path / "root")), "client": client}
    r = ingest_date(DATE, input=inp, ingest=IngestConfig(rows_per_partition=250), **kw)
    assert (r.rows_read, r.rows_written, r.rows_quarantined) == (600, 599, 1)
    q = read_quarantine(Layout(str(tmp_path / "root")), DATE)
    assert q["line"].tolist() == [6] and "expected yes or no" in q["reason"].iloc[0]
    events = pd.read_parquet(tmp_path / "root" / "events" / f"date={DATE}")
    for got, line in zip(events["tags"].iloc[:4], rows[1:5], strict=True):
        text = line.split(";")[-1]
        assert (None if got is None else list(got)) == (text.split("|") if text else None)
    assert events["ts"].iloc[0] == day0
    v = build_vocab(DATE, vocab=VocabConfig(min_count=1), fmt=fmt, **kw)
    assert v.admitted == 4 + 6  # 4 sites, 6 tags
    e = encode_date(DATE, encode=EncodeConfig(), fmt=fmt, **kw)
    feats = pd.read_parquet(tmp_path / "root" / "features" / f"date={DATE}" / "train")
    assert len(feats) == e.rows_train and list(feats.columns) == [
        "label",
        "d_0",
        "d_1",
        "k_0",
        "k_1",
        "bag_1",
        "r_0",
        "r_1",
    ]  # a small day: own keys too
    tag_keys = {t: int(feature_keys(1, [f"t{t}"])[0]) for t in range(6)}
    for row_tags, first, bag in zip(events["tags"].iloc[: len(feats)], feats["k_1"], feats["bag_1"], strict=True):
        want = [tag_keys[int(t[1:])] for t in (row_tags if row_tags is not None else []) if t]
        assert list(bag) == want and first == (want[0] if want else missing_key(1))
    manifest = json.loads((tmp_path / "root" / "features" / f"date={DATE}" / "_SUCCESS.json").read_text())
    assert manifest["bag_columns"] == ["bag_1"] and sum(p["rows"] for p in manifest["train_part_rows"]) == e.rows_train


def test_schema_file_errors_name_the_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("columns: [a, b]\nlabel: a\ncategorical: [c]\n")
    with pytest.raises(ValueError, match=r"bad.yaml.*'c' is not in columns"):
        get_schema(str(bad))


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="avazu"):
        get_schema("parquet")
