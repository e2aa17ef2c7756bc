"""New formats (YAML schema files, multi-valued fields), the CSV fast path vs the per-line path,
byte-range splitting of large plain files, and the events/quarantine commit pair."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from pipeline.config import EncodeConfig, IngestConfig, InputConfig, VocabConfig
from pipeline.encode import encode_date
from pipeline.ingest import IngestError, ingest_date, read_quarantine
from pipeline.keys import feature_keys, missing_key
from pipeline.parse import parse_chunk, parse_table
from pipeline.schema import CRITEO, get_schema
from pipeline.vocab_stage import build_vocab, load_admitted, load_report
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
    kw = dict(layout=Layout(str(tmp_path / "root")), client=client)
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
    assert len(feats) == e.rows_train and list(feats.columns) == ["label", "d_0", "d_1", "k_0", "k_1", "bag_1"]
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
    with pytest.raises(ValueError, match="input.format must be one of"):
        InputConfig(format="shop.json")
    assert InputConfig(format="s3://bucket/shop.yml").format.endswith(".yml")


def criteo_text(raw_days, n: int) -> bytes:
    return b"".join(gzip.decompress((raw_days.path / f"day_{DATE}.tsv.gz").read_bytes()).splitlines(True)[:n])


def test_fast_path_and_per_line_path_give_the_same_rows(raw_days):
    data = criteo_text(raw_days, 500)
    lines = data.splitlines(True)
    fast = parse_table(data, schema=CRITEO, file="f", first_line=3)
    assert fast.fast_path
    broken = b"".join(lines[:100] + [b"x\ty\n"] + lines[100:])  # one short line: per-line path
    slow = parse_table(broken, schema=CRITEO, file="f", first_line=3)
    assert not slow.fast_path and slow.quarantine.column("line").to_pylist() == [103]
    a, b = fast.events.to_pandas(), slow.events.to_pandas()
    b.loc[b.index >= 100, "order"] -= 1
    pd.testing.assert_frame_equal(a, b)
    bad_value = b"".join(lines[:10] + [lines[10].replace(b"\t", b"\tabc\t", 1).replace(b"\t", b"", 2)] + lines[11:])
    mixed = parse_chunk(bad_value, schema=CRITEO, file="f")  # a non-number: string fast path, value check
    assert len(mixed.events) + len(mixed.quarantine) == 500


def test_a_large_plain_file_is_split_in_byte_ranges_with_true_line_numbers(tmp_path, raw_days, client):
    lines = criteo_text(raw_days, 4000).splitlines(True)
    for i in (7, 1999, 3998):
        lines[i] = b"bad\tline\n"
    (tmp_path / f"day_{DATE}.tsv").write_bytes(b"".join(lines))
    inp = InputConfig(url=str(tmp_path / "day_{date}.tsv"))
    kw = dict(input=inp, client=client)
    whole = ingest_date(DATE, layout=Layout(str(tmp_path / "a")), ingest=IngestConfig(rows_per_partition=700,
                        max_bad_fraction=0.01), **kw)  # fmt: skip
    split = ingest_date(DATE, layout=Layout(str(tmp_path / "b")), ingest=IngestConfig(rows_per_partition=700,
                        max_bad_fraction=0.01, block_size=50_000), **kw)  # fmt: skip
    manifest = json.loads((tmp_path / "b" / "events" / f"date={DATE}" / "_SUCCESS.json").read_text())
    assert manifest["blocks"] > 10 and (split.rows_written, split.rows_quarantined) == (whole.rows_written, 3)
    ev = [pd.read_parquet(tmp_path / r / "events" / f"date={DATE}") for r in ("a", "b")]
    pd.testing.assert_frame_equal(ev[0], ev[1])
    assert ev[1]["order"].is_monotonic_increasing
    assert read_quarantine(Layout(str(tmp_path / "b")), DATE)["line"].tolist() == [8, 2000, 3999]


def test_a_quarantine_of_another_run_is_detected_and_the_date_is_redone(tmp_path, raw_days, client):
    shutil.copytree(raw_days.path, tmp_path / "raw")
    kw = dict(layout=Layout(str(tmp_path)), input=InputConfig(), ingest=IngestConfig(), client=client)
    ingest_date(DATE, **kw)
    qm = tmp_path / "quarantine" / f"date={DATE}" / "_SUCCESS.json"
    m = json.loads(qm.read_text())
    qm.write_text(json.dumps({**m, "events_run_id": "crashed-run"}))  # as if killed between the two commits
    with pytest.raises(IngestError, match="rerun the ingest") as info:
        read_quarantine(Layout(str(tmp_path)), DATE)
    assert info.value.kind == "inconsistent"
    assert not ingest_date(DATE, **kw).skipped and len(read_quarantine(Layout(str(tmp_path)), DATE)) == 0
    assert ingest_date(DATE, **kw).skipped


def test_vocab_report_is_written_per_date(tmp_path, raw_days, client):
    shutil.copytree(raw_days.path, tmp_path / "raw")
    ingest_date(DATE, layout=Layout(str(tmp_path)), input=InputConfig(), ingest=IngestConfig(), client=client)
    cfg = VocabConfig(min_count=2, min_count_per_field={"C3": 1000}, max_keys_per_field=50)
    build_vocab(DATE, layout=Layout(str(tmp_path)), vocab=cfg, fmt="criteo", client=client)
    report = load_report(Layout(str(tmp_path)), DATE).set_index("field")
    assert list(report.index) == list(CRITEO.categorical) and report["admitted"].max() <= 50
    assert report.loc["C3", "admitted"] == 0 and (report["coverage"] + report["oov_rate"] <= 1 + 1e-9).all()
    assert len(load_admitted(Layout(str(tmp_path)), DATE)) == report["admitted"].sum()
    md = (tmp_path / "vocab" / f"date={DATE}" / "report.md").read_text()
    assert md.startswith(f"# Vocabulary {DATE}") and "| C3 |" in md and "max_keys_per_field=50" in md
    with pytest.raises(ValueError, match=r"unknown fields \['C99'\]"):
        build_vocab(DATE, layout=Layout(str(tmp_path)), vocab=VocabConfig(min_count_per_field={"C99": 2}), fmt="criteo",
                    client=client, force=True)  # fmt: skip
