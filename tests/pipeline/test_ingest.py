"""Ingest: raw files of a date -> committed events + quarantine, with exact row accounting."""

import gzip
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.cluster import dask_client
from pipeline.config import DaskConfig, IngestConfig, InputConfig
from pipeline.ingest import IngestError, ingest_date, read_quarantine
from storage.io.fsio import SUCCESS
from storage.io.layout import Layout

SMALL_PARTS = IngestConfig(rows_per_partition=1500)
DAYS = ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04")  # the `raw_days` fixture's days
ROWS_PER_DAY = 4000


def events_of(root: Path, date: str) -> pd.DataFrame:
    parts = sorted((root / "events" / f"date={date}").glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def siblings(root: Path, stage: str) -> list[str]:
    return sorted(p.name for p in (root / stage).iterdir()) if (root / stage).exists() else []


@pytest.fixture()
def root(tmp_path, raw_days) -> Path:
    assert (raw_days.dates, raw_days.rows) == (DAYS, ROWS_PER_DAY)
    shutil.copytree(raw_days.path, tmp_path / "raw")
    return tmp_path


def test_a_day_is_committed_with_every_row_accounted_for(root, client):
    r = ingest_date(DAYS[0], layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert (r.rows_read, r.rows_written, r.rows_quarantined, r.rows_other_dates) == (ROWS_PER_DAY, ROWS_PER_DAY, 0, 0)
    assert r.parts == 3 and not r.skipped
    assert r.inputs[0]["url"].endswith(f"raw/day_{DAYS[0]}.tsv.gz") and r.inputs[0]["size"] > 0
    manifest = pd.read_json(root / "events" / f"date={DAYS[0]}" / SUCCESS, typ="series")
    assert manifest["rows_read"] == manifest["rows_written"] + manifest["rows_quarantined"]
    assert [p["rows"] for p in manifest["parts"]] == [1500, 1500, 1000]
    assert manifest["format"] == "criteo" and manifest["code_version"]
    assert (root / "quarantine" / f"date={DAYS[0]}" / SUCCESS).exists()
    events = events_of(root, DAYS[0])
    assert len(events) == ROWS_PER_DAY and events["order"].is_monotonic_increasing  # names sort in time order
    assert str(events["label"].dtype) == "int8" and str(events["I1"].dtype) == "float32"


def test_rerun_with_unchanged_inputs_is_skipped_and_forced_rerun_is_identical(root, client):
    kw = dict(layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    first = ingest_date(DAYS[0], **kw)
    before = events_of(root, DAYS[0])
    again = ingest_date(DAYS[0], **kw)
    assert again.skipped and again.rows_written == first.rows_written
    forced = ingest_date(DAYS[0], force=True, **kw)
    assert not forced.skipped
    pd.testing.assert_frame_equal(events_of(root, DAYS[0]), before)
    assert siblings(root, "events") == [f"date={DAYS[0]}"]  # no staging or old copies left


def test_changed_inputs_are_reingested(root, client):
    kw = dict(layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    ingest_date(DAYS[0], **kw)
    raw = root / "raw" / f"day_{DAYS[0]}.tsv.gz"
    lines = gzip.decompress(raw.read_bytes()).splitlines(keepends=True)
    raw.write_bytes(gzip.compress(b"".join(lines[:1000])))
    r = ingest_date(DAYS[0], **kw)
    assert not r.skipped and r.rows_written == 1000


def test_too_many_bad_rows_fails_naming_the_file_and_commits_nothing(root, client):
    raw = root / "raw" / f"day_{DAYS[1]}.tsv.gz"
    lines = gzip.decompress(raw.read_bytes()).splitlines(keepends=True)
    lines[10:60] = [b"not\ta\trow\n"] * 50
    raw.write_bytes(gzip.compress(b"".join(lines)))
    with pytest.raises(IngestError, match=r"day_2026-01-02\.tsv\.gz.*wrong field count") as info:
        ingest_date(DAYS[1], layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert info.value.kind == "too_many_bad_rows"
    assert siblings(root, "events") == [] and siblings(root, "quarantine") == []
    loose = IngestConfig(rows_per_partition=1500, max_bad_fraction=0.05)
    r = ingest_date(DAYS[1], layout=Layout(str(root)), input=InputConfig(), ingest=loose, client=client)
    assert r.rows_quarantined == 50 and r.rows_read == r.rows_written + 50
    q = pd.read_parquet(root / "quarantine" / f"date={DAYS[1]}")
    assert q["line"].tolist() == list(range(11, 61)) and set(q["raw"]) == {"not\ta\trow"}


def test_missing_input_names_the_date_and_url(root, client):
    with pytest.raises(FileNotFoundError, match=r"no input for 2027-01-01 at .*day_2027-01-01\.tsv\.gz"):
        ingest_date("2027-01-01", layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)


def test_a_truncated_gzip_fails_naming_the_file(root, client):
    raw = root / "raw" / f"day_{DAYS[2]}.tsv.gz"
    raw.write_bytes(raw.read_bytes()[: raw.stat().st_size // 2])
    with pytest.raises(IngestError, match=r"day_2026-01-03\.tsv\.gz.*truncated or corrupt") as info:
        ingest_date(DAYS[2], layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert info.value.kind == "corrupt_input" and siblings(root, "events") == []


def test_leftover_staging_dirs_of_crashed_runs_are_removed(root, client):
    stale = root / "events" / f"date={DAYS[0]}.staging-deadbeef0000"
    stale.mkdir(parents=True)
    (stale / "part-00000-00000.parquet").write_bytes(b"partial")
    ingest_date(DAYS[0], layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert siblings(root, "events") == [f"date={DAYS[0]}"]


def test_a_glob_url_reads_several_files_in_name_order(root, client):
    split = root / "split"
    split.mkdir()
    lines = gzip.decompress((root / "raw" / f"day_{DAYS[0]}.tsv.gz").read_bytes()).splitlines(keepends=True)
    (split / "20260101-a.tsv").write_bytes(b"".join(lines[:2500]))
    (split / "20260101-b.tsv.bz2").write_bytes(__import__("bz2").compress(b"".join(lines[2500:])))
    url = str(split / "{yyyymmdd}-*.tsv*")
    r = ingest_date(DAYS[0], layout=Layout(str(root)), input=InputConfig(url=url), ingest=SMALL_PARTS, client=client)
    assert r.rows_written == ROWS_PER_DAY and len(r.inputs) == 2 and r.parts == 3  # 1500+1000, 1500
    events = events_of(root, DAYS[0])
    assert events["order"].is_monotonic_increasing and int(events["order"].iloc[-1]) >> 40 == 1


def test_a_criteo_url_without_the_date_is_refused(root, client):
    with pytest.raises(ValueError, match="placeholder"):
        ingest_date(DAYS[0], layout=Layout(str(root)), input=InputConfig(url=str(root / "raw" / "*.gz")), ingest=SMALL_PARTS,
                    client=client)  # fmt: skip


def test_worker_processes_run_the_same_ingest(root):
    with dask_client(DaskConfig(n_workers=1, processes=True, memory_limit="1GiB")) as client:
        r = ingest_date(DAYS[3], layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert r.rows_written == ROWS_PER_DAY


def test_real_criteo_sample_split_into_days(tmp_path, shared_data, client):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_bytes().splitlines(keepends=True)
    (tmp_path / "day_2026-02-01.tsv").write_bytes(b"".join(lines[:5000]))
    (tmp_path / "day_2026-02-02.tsv.gz").write_bytes(gzip.compress(b"".join(lines[5000:])))
    url = str(tmp_path / "day_{date}.tsv*")
    results = [
        ingest_date(d, layout=Layout(str(tmp_path / "root")), input=InputConfig(url=url), ingest=IngestConfig(), client=client)
        for d in ("2026-02-01", "2026-02-02")
    ]
    assert [r.rows_written for r in results] == [5000, 5000] and sum(r.rows_quarantined for r in results) == 0
    clicks = sum(events_of(tmp_path / "root", d)["label"].sum() for d in ("2026-02-01", "2026-02-02"))
    assert clicks == 2182


def test_real_avazu_sample_is_dated_by_its_hour(tmp_path, shared_data, client):
    text = (shared_data / "avazu" / "avazu_14102100.csv").read_text().splitlines(keepends=True)
    moved = [line.replace(",14102100,", ",14102200,") for line in text[-1000:]]  # the next day's rows
    path = tmp_path / "avazu.csv"
    path.write_text("".join(text[:-1000] + moved))
    kw = dict(layout=Layout(str(tmp_path / "root")), input=InputConfig(url=str(path), format="avazu"), client=client)
    r = ingest_date("2014-10-21", ingest=IngestConfig(rows_per_partition=4000), **kw)
    assert (r.rows_read, r.rows_written, r.rows_other_dates, r.rows_quarantined) == (9999, 8999, 1000, 0)
    assert set(events_of(tmp_path / "root", "2014-10-21")["ts"]) == {1413849600}
    with pytest.raises(IngestError, match="no rows of 2014-10-23") as info:
        ingest_date("2014-10-23", ingest=IngestConfig(), **kw)
    assert info.value.kind == "no_rows"


def quirky_day(root: Path) -> bytes:
    """Day DAYS[0] with a BOM, CRLF line ends, blank lines and bad rows spread over several chunks."""
    lines = gzip.decompress((root / "raw" / f"day_{DAYS[0]}.tsv.gz").read_bytes()).splitlines(keepends=True)
    lines[0] = b"\xef\xbb\xbf" + lines[0]
    for i in range(1, len(lines), 3):
        lines[i] = lines[i].replace(b"\n", b"\r\n")
    for i in (5, 1499, 1500, 2222):
        lines[i] = b"\n"
    for i in (10, 1501, 3999):
        lines[i] = b"not\ta\trow\n"
    fields = lines[777].split(b"\t")
    lines[777] = b"\t".join([fields[0], b"x1", *fields[2:]])  # a non-numeric I1
    return b"".join(lines)


@pytest.mark.parametrize("compress", [gzip.compress, lambda b: b], ids=["gzip", "plain"])
def test_reading_ahead_and_writing_behind_in_threads_changes_no_output(root, client, compress):
    name = "quirky-{date}.tsv.gz" if compress is gzip.compress else "quirky-{date}.tsv"
    (root / name.format(date=DAYS[0])).write_bytes(compress(quirky_day(root)))
    out = {}
    for overlap in (False, True):
        cfg = IngestConfig(rows_per_partition=700, max_bad_fraction=0.01, overlap_io=overlap)
        out_root = root / f"overlap-{overlap}"
        r = ingest_date(DAYS[0], layout=Layout(str(out_root)), input=InputConfig(url=str(root / name)), ingest=cfg, client=client)
        out[overlap] = (r, events_of(out_root, DAYS[0]), read_quarantine(Layout(str(out_root)), DAYS[0]))
    (r0, ev0, q0), (r1, ev1, q1) = out[False], out[True]
    assert (r1.rows_read, r1.rows_written, r1.rows_quarantined, r1.parts) == (r0.rows_read, r0.rows_written, 8, 6)
    pd.testing.assert_frame_equal(ev1, ev0)
    pd.testing.assert_frame_equal(q1, q0)
    assert q1["line"].tolist() == [6, 11, 778, 1500, 1501, 1502, 2223, 4000]  # true 1-based line numbers
    assert q1["reason"].tolist()[:3] == ["blank line", "wrong field count: 3 fields, expected 14..40",
                                         "non-numeric integer field: I1='x1'"]  # fmt: skip


@pytest.mark.parametrize("overlap", [False, True])
def test_a_corrupt_gzip_fails_naming_the_file_with_or_without_read_ahead(root, client, overlap):
    raw = root / "raw" / f"day_{DAYS[2]}.tsv.gz"
    gz = raw.read_bytes()
    raw.write_bytes(gz[:4000] + bytes(200) + gz[4200:])  # damaged inside, not at the end
    cfg = IngestConfig(rows_per_partition=1500, overlap_io=overlap)
    with pytest.raises(IngestError, match=r"day_2026-01-03\.tsv\.gz: cannot decompress \(gzip\).*truncated or corrupt") as info:
        ingest_date(DAYS[2], layout=Layout(str(root)), input=InputConfig(), ingest=cfg, client=client)
    assert info.value.kind == "corrupt_input" and siblings(root, "events") == [] and siblings(root, "quarantine") == []


def test_events_parts_keep_min_max_statistics_of_numeric_columns_only(root, client):
    # categorical values are hashes: their min/max prunes nothing and costs a fifth of the write
    ingest_date(DAYS[0], layout=Layout(str(root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    part = sorted((root / "events" / f"date={DAYS[0]}").glob("part-*.parquet"))[0]
    meta = pq.ParquetFile(part).metadata.row_group(0)
    with_stats = {meta.column(i).path_in_schema for i in range(meta.num_columns) if meta.column(i).is_stats_set}
    assert with_stats == {"label", "ts", "order", *(f"I{i}" for i in range(1, 14))}
