"""Ingest tasks: one raw file (or byte range) streamed chunk by chunk into Parquet parts; reading ahead
and writing behind change no output; a damaged compressed file fails the task naming it."""

import gzip
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from pipeline.config import IngestConfig, InputConfig
from pipeline.ingest.error import IngestError
from pipeline.ingest.stage import ingest_date, read_quarantine
from pipeline.ingest.tasks import FileTask, count_newlines, ingest_file
from pipeline.schema import CRITEO
from storage.io.layout import Layout
from tests.helpers.raw_days import DAYS, criteo_text, events_of, siblings

SMALL_PARTS = IngestConfig(rows_per_partition=1500)


def test_a_truncated_gzip_fails_naming_the_file(raw_root, client):
    raw = raw_root / "raw" / f"day_{DAYS[2]}.tsv.gz"
    raw.write_bytes(raw.read_bytes()[: raw.stat().st_size // 2])
    with pytest.raises(IngestError, match=r"day_2026-01-03\.tsv\.gz.*truncated or corrupt") as info:
        ingest_date(DAYS[2], layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert info.value.kind == "corrupt_input" and siblings(raw_root, "events") == []


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
def test_reading_ahead_and_writing_behind_in_threads_changes_no_output(raw_root, client, compress):
    name = "quirky-{date}.tsv.gz" if compress is gzip.compress else "quirky-{date}.tsv"
    (raw_root / name.format(date=DAYS[0])).write_bytes(compress(quirky_day(raw_root)))
    out = {}
    for overlap in (False, True):
        cfg = IngestConfig(rows_per_partition=700, max_bad_fraction=0.01, overlap_io=overlap)
        out_root = raw_root / f"overlap-{overlap}"
        r = ingest_date(
            DAYS[0],
            layout=Layout(str(out_root)),
            input=InputConfig(url=str(raw_root / name)),
            ingest=cfg,
            client=client,
        )
        out[overlap] = (r, events_of(out_root, DAYS[0]), read_quarantine(Layout(str(out_root)), DAYS[0]))
    (r0, ev0, q0), (r1, ev1, q1) = out[False], out[True]
    assert (r1.rows_read, r1.rows_written, r1.rows_quarantined, r1.parts) == (r0.rows_read, r0.rows_written, 8, 6)
    pd.testing.assert_frame_equal(ev1, ev0)
    pd.testing.assert_frame_equal(q1, q0)
    assert q1["line"].tolist() == [6, 11, 778, 1500, 1501, 1502, 2223, 4000]  # true 1-based line numbers
    assert q1["reason"].tolist()[:3] == [
        "blank line",
        "wrong field count: 3 fields, expected 14..40",
        "non-numeric integer field: I1='x1'",
    ]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_corrupt_gzip_fails_naming_the_file_with_or_without_read_ahead(raw_root, client, overlap):
    raw = raw_root / "raw" / f"day_{DAYS[2]}.tsv.gz"
    gz = raw.read_bytes()
    raw.write_bytes(gz[:4000] + bytes(200) + gz[4200:])  # damaged inside, not at the end
    cfg = IngestConfig(rows_per_partition=1500, overlap_io=overlap)
    with pytest.raises(
        IngestError, match=r"day_2026-01-03\.tsv\.gz: cannot decompress \(gzip\).*truncated or corrupt"
    ) as info:
        ingest_date(DAYS[2], layout=Layout(str(raw_root)), input=InputConfig(), ingest=cfg, client=client)
    assert (
        info.value.kind == "corrupt_input"
        and siblings(raw_root, "events") == []
        and siblings(raw_root, "quarantine") == []
    )


def test_events_parts_keep_min_max_statistics_of_numeric_columns_only(raw_root, client):
    # categorical values are hashes: their min/max prunes nothing and costs a fifth of the write
    ingest_date(DAYS[0], layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    part = sorted((raw_root / "events" / f"date={DAYS[0]}").glob("part-*.parquet"))[0]
    meta = pq.ParquetFile(part).metadata.row_group(0)
    with_stats = {meta.column(i).path_in_schema for i in range(meta.num_columns) if meta.column(i).is_stats_set}
    assert with_stats == {"label", "ts", "order", *(f"I{i}" for i in range(1, 14))}


def test_byte_ranges_own_the_lines_that_start_in_them_and_number_them_truly(tmp_path, raw_days):
    data = criteo_text(raw_days, 1000)
    (tmp_path / "day.tsv").write_bytes(data)
    cut = data.index(b"\n", len(data) // 2) - 5  # inside a line: that line belongs to the first range
    first_line = 2 + count_newlines((str(tmp_path / "day.tsv"), 0, cut - 1))
    fs = LocalFileSystem()
    for d in ("events", "quarantine"):
        fs.makedirs(str(tmp_path / d))
    results = [
        ingest_file(
            FileTask(
                url=str(tmp_path / "day.tsv"),
                file_index=0,
                schema=CRITEO,
                input_options=None,
                out_fs=fs,
                events_dir=str(tmp_path / "events"),
                quarantine_dir=str(tmp_path / "quarantine"),
                rows_per_partition=300,
                date=DAYS[0],
                block_index=b,
                start=start,
                end=end,
                first_line=line,
            )
        )
        for b, (start, end, line) in enumerate([(0, cut, 1), (cut, None, first_line)])
    ]
    assert first_line == data[:cut].count(b"\n") + 2  # the line cut in two is the first range's
    assert [r["rows_written"] for r in results] == [first_line - 1, 1000 - (first_line - 1)]
    assert [p["name"] for p in results[1]["parts"]][0] == "part-00000-00001-00000.parquet"
    orders = pq.read_table(tmp_path / "events" / results[1]["parts"][0]["name"]).column("order").to_pylist()
    assert orders[0] == first_line and orders == list(range(first_line, first_line + len(orders)))
