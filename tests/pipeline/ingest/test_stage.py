"""The ingest stage: raw files of a date -> committed events + quarantine, with exact row accounting,
reruns skipped, byte-range planning of large plain files and one commit for the pair."""

import bz2
import gzip
import json
import re

import pandas as pd
import pytest

from pipeline.cluster import dask_client
from pipeline.config import DaskConfig, IngestConfig, InputConfig
from pipeline.ingest.error import IngestError
from pipeline.ingest.stage import ingest_date, read_quarantine
from storage.io.fsio import SUCCESS
from storage.io.layout import Layout
from tests.helpers.raw_days import DAYS, ROWS_PER_DAY, criteo_text, events_of, siblings

SMALL_PARTS = IngestConfig(rows_per_partition=1500)


def test_a_day_is_committed_with_every_row_accounted_for(raw_root, client):
    r = ingest_date(DAYS[0], layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert (r.rows_read, r.rows_written, r.rows_quarantined, r.rows_other_dates) == (ROWS_PER_DAY, ROWS_PER_DAY, 0, 0)
    assert r.parts == 3 and not r.skipped
    assert r.inputs[0]["url"].endswith(f"raw/day_{DAYS[0]}.tsv.gz") and r.inputs[0]["size"] > 0
    manifest = pd.read_json(raw_root / "events" / f"date={DAYS[0]}" / SUCCESS, typ="series")
    assert manifest["rows_read"] == manifest["rows_written"] + manifest["rows_quarantined"]
    assert [p["rows"] for p in manifest["parts"]] == [1500, 1500, 1000]
    assert manifest["format"] == "criteo" and manifest["code_version"]
    assert (raw_root / "quarantine" / f"date={DAYS[0]}" / SUCCESS).exists()
    events = events_of(raw_root, DAYS[0])
    assert len(events) == ROWS_PER_DAY and events["order"].is_monotonic_increasing  # names sort in time order
    assert str(events["label"].dtype) == "int8" and str(events["I1"].dtype) == "float32"


def test_rerun_with_unchanged_inputs_is_skipped_and_forced_rerun_is_identical(raw_root, client):
    kw = {"layout": Layout(str(raw_root)), "input": InputConfig(), "ingest": SMALL_PARTS, "client": client}
    first = ingest_date(DAYS[0], **kw)
    before = events_of(raw_root, DAYS[0])
    again = ingest_date(DAYS[0], **kw)
    assert again.skipped and again.rows_written == first.rows_written
    forced = ingest_date(DAYS[0], force=True, **kw)
    assert not forced.skipped
    pd.testing.assert_frame_equal(events_of(raw_root, DAYS[0]), before)
    assert siblings(raw_root, "events") == [f"date={DAYS[0]}"]  # no staging or old copies left


def test_changed_inputs_are_reingested(raw_root, client):
    kw = {"layout": Layout(str(raw_root)), "input": InputConfig(), "ingest": SMALL_PARTS, "client": client}
    ingest_date(DAYS[0], **kw)
    raw = raw_root / "raw" / f"day_{DAYS[0]}.tsv.gz"
    lines = gzip.decompress(raw.read_bytes()).splitlines(keepends=True)
    raw.write_bytes(gzip.compress(b"".join(lines[:1000])))
    r = ingest_date(DAYS[0], **kw)
    assert not r.skipped and r.rows_written == 1000


def test_too_many_bad_rows_fails_naming_the_file_and_commits_nothing(raw_root, client):
    raw = raw_root / "raw" / f"day_{DAYS[1]}.tsv.gz"
    lines = gzip.decompress(raw.read_bytes()).splitlines(keepends=True)
    lines[10:60] = [b"not\ta\trow\n"] * 50
    raw.write_bytes(gzip.compress(b"".join(lines)))
    with pytest.raises(IngestError) as info:
        ingest_date(DAYS[1], layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert info.value.kind == "too_many_bad_rows"
    lines_of_message = str(info.value).splitlines()
    assert (
        len(lines_of_message) <= 4
        and "4000 rows read = 3950 valid + 50 quarantined (1.25%) + 0 dated elsewhere" in lines_of_message[0]
    )
    assert re.search(
        r"wrong field count x50, e\.g\. \S*day_2026-01-02\.tsv\.gz line 11: 3 fields, expected 14\.\.40",
        str(info.value),
    )  # the counts found and expected, and where
    assert (
        "raise ingest.max_bad_fraction (now 0.01)" in lines_of_message[-1]
    )  # a few bad rows: accepting them is an option
    assert siblings(raw_root, "events") == [] and siblings(raw_root, "quarantine") == []
    loose = IngestConfig(rows_per_partition=1500, max_bad_fraction=0.05)
    r = ingest_date(DAYS[1], layout=Layout(str(raw_root)), input=InputConfig(), ingest=loose, client=client)
    assert r.rows_quarantined == 50 and r.rows_read == r.rows_written + 50
    q = pd.read_parquet(raw_root / "quarantine" / f"date={DAYS[1]}")
    assert q["line"].tolist() == list(range(11, 61)) and set(q["raw"]) == {"not\ta\trow"}


def test_missing_input_names_the_date_and_url(raw_root, client):
    with pytest.raises(
        FileNotFoundError,
        match=r"no input for 2027-01-01 at .*day_2027-01-01\.tsv\.gz: no file matches the input URL; check input\.url",
    ):
        ingest_date("2027-01-01", layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)


SHOP = "ts,clicked,site\n" + "".join(f"2026-02-01 10:00:{i % 60:02d},{i % 2},s{i % 7}\n" for i in range(300))


def _shop_schema(tmp_path, text: str):
    path = tmp_path / "shop.yaml"
    path.write_text("header: true\ncolumns: [ts, clicked, site]\nlabel: clicked\ncategorical: [site]\n" + text)
    return str(path)


def _ingest_shop(tmp_path, client, schema_text: str, data: str = SHOP):
    (tmp_path / "shop.csv").write_text(data)
    inp = InputConfig(url=str(tmp_path / "shop.csv"), format=_shop_schema(tmp_path, schema_text))
    return ingest_date(
        "2026-02-01", layout=Layout(str(tmp_path / "root")), input=inp, ingest=IngestConfig(), client=client
    )


def test_a_csv_schema_without_its_separator_says_the_separator_is_the_likely_cause(tmp_path, client):
    with pytest.raises(
        ValueError,
        match=r"shop\.csv: line 1 is the header of the shop columns split on ',', but the "
        r"format's separator is '\\t': set separator: ','",
    ):
        _ingest_shop(tmp_path, client, "timestamp: {column: ts, format: '%Y-%m-%d %H:%M:%S'}\n")


def test_a_timestamp_format_mistake_shows_a_sample_value_and_the_format_not_the_bad_fraction(tmp_path, client):
    with pytest.raises(IngestError) as info:
        _ingest_shop(tmp_path, client, "separator: ','\ntimestamp: {column: ts, format: '%d/%m/%Y %H:%M'}\n")
    text = str(info.value)
    assert (
        "bad timestamp x300, e.g. " in text
        and "shop.csv line 2: ts='2026-02-01 10:00:00', expected format '%d/%m/%Y %H:%M'" in text
    )
    assert "fix timestamp.format in the schema file" in text and "max_bad_fraction (now" not in text


def test_an_empty_file_says_the_file_is_empty(tmp_path, client):
    with pytest.raises(IngestError, match=r"no rows for 2026-02-01: \S*shop\.csv is empty") as info:
        _ingest_shop(
            tmp_path, client, "separator: ','\ntimestamp: {column: ts, format: '%Y-%m-%d %H:%M:%S'}\n", data=""
        )
    assert info.value.kind == "no_rows"


def test_ingest_advances_a_progress_bar_once_per_file(raw_root, client, monkeypatch):
    bars = []

    class Recording:
        def __init__(self, description, total=None):
            self.description, self.total, self.done = description, total, 0
            bars.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def advance(self, n=1):
            self.done += n

    monkeypatch.setattr("pipeline.ingest.stage.Bar", Recording)
    split = raw_root / "split"
    split.mkdir()
    lines = gzip.decompress((raw_root / "raw" / f"day_{DAYS[0]}.tsv.gz").read_bytes()).splitlines(keepends=True)
    for i, name in enumerate(("a", "b", "c")):
        (split / f"20260101-{name}.tsv").write_bytes(b"".join(lines[i * 1000 : (i + 1) * 1000]))
    inp = InputConfig(url=str(split / "{yyyymmdd}-*.tsv"))
    ingest_date(DAYS[0], layout=Layout(str(raw_root)), input=inp, ingest=SMALL_PARTS, client=client)
    assert [(b.description, b.total, b.done) for b in bars] == [(f"ingest {DAYS[0]}: files", 3, 3)]


def test_leftover_staging_dirs_of_crashed_runs_are_removed(raw_root, client):
    stale = raw_root / "events" / f"date={DAYS[0]}.staging-deadbeef0000"
    stale.mkdir(parents=True)
    (stale / "part-00000-00000.parquet").write_bytes(b"partial")
    ingest_date(DAYS[0], layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert siblings(raw_root, "events") == [f"date={DAYS[0]}"]


def test_a_glob_url_reads_several_files_in_name_order(raw_root, client):
    split = raw_root / "split"
    split.mkdir()
    lines = gzip.decompress((raw_root / "raw" / f"day_{DAYS[0]}.tsv.gz").read_bytes()).splitlines(keepends=True)
    (split / "20260101-a.tsv").write_bytes(b"".join(lines[:2500]))
    (split / "20260101-b.tsv.bz2").write_bytes(bz2.compress(b"".join(lines[2500:])))
    url = str(split / "{yyyymmdd}-*.tsv*")
    r = ingest_date(
        DAYS[0], layout=Layout(str(raw_root)), input=InputConfig(url=url), ingest=SMALL_PARTS, client=client
    )
    assert r.rows_written == ROWS_PER_DAY and len(r.inputs) == 2 and r.parts == 3  # 1500+1000, 1500
    events = events_of(raw_root, DAYS[0])
    assert events["order"].is_monotonic_increasing and int(events["order"].iloc[-1]) >> 40 == 1


def test_a_criteo_url_without_the_date_is_refused(raw_root, client):
    with pytest.raises(ValueError, match="placeholder"):
        ingest_date(
            DAYS[0],
            layout=Layout(str(raw_root)),
            input=InputConfig(url=str(raw_root / "raw" / "*.gz")),
            ingest=SMALL_PARTS,
            client=client,
        )


@pytest.mark.server  # a LocalCluster of worker processes and its scheduler
def test_worker_processes_run_the_same_ingest(raw_root):
    with dask_client(DaskConfig(n_workers=1, processes=True, memory_limit="1GiB")) as client:
        r = ingest_date(DAYS[3], layout=Layout(str(raw_root)), input=InputConfig(), ingest=SMALL_PARTS, client=client)
    assert r.rows_written == ROWS_PER_DAY


def test_real_criteo_sample_split_into_days(tmp_path, shared_data, client):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_bytes().splitlines(keepends=True)
    (tmp_path / "day_2026-02-01.tsv").write_bytes(b"".join(lines[:5000]))
    (tmp_path / "day_2026-02-02.tsv.gz").write_bytes(gzip.compress(b"".join(lines[5000:])))
    url = str(tmp_path / "day_{date}.tsv*")
    results = [
        ingest_date(
            d, layout=Layout(str(tmp_path / "root")), input=InputConfig(url=url), ingest=IngestConfig(), client=client
        )
        for d in ("2026-02-01", "2026-02-02")
    ]
    assert [r.rows_written for r in results] == [5000, 5000] and sum(r.rows_quarantined for r in results) == 0
    clicks = sum(events_of(tmp_path / "root", d)["label"].sum() for d in ("2026-02-01", "2026-02-02"))
    assert clicks == 2182
    # the day statistics the data checks read, counted in the same pass (manifest `stats`)
    assert sum(r.stats["clicks"] for r in results) == 2182 and [r.rows_padded for r in results] == [0, 0]
    events = events_of(tmp_path / "root", "2026-02-01")
    assert results[0].stats["missing"]["I1"] == int(events["I1"].isna().sum()) > 0
    assert results[0].stats["missing"]["C3"] == int(events["C3"].isna().sum())
    assert sum(results[0].stats["dense_hist"]["I2"]) == 5000 - int(events["I2"].isna().sum())


def test_rows_cut_short_are_counted_as_padded_not_quarantined(tmp_path, shared_data, client):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_bytes().splitlines()[:1000]
    cut = [b"\t".join(line.split(b"\t")[:20]) for line in lines[:300]] + lines[300:]
    (tmp_path / "day_2026-02-01.tsv").write_bytes(b"\n".join(cut) + b"\n")
    r = ingest_date(
        "2026-02-01",
        layout=Layout(str(tmp_path / "root")),
        input=InputConfig(url=str(tmp_path / "day_{date}.tsv")),
        ingest=IngestConfig(),
        client=client,
    )
    assert (r.rows_written, r.rows_quarantined, r.rows_padded) == (1000, 0, 300)


def test_a_late_input_is_waited_for(raw_root, client, tmp_path):
    """The day's file lands halfway through input.wait_s: ingest waits, then commits it."""
    import threading

    late = tmp_path / "late"
    late.mkdir()
    src = raw_root / "raw" / f"day_{DAYS[0]}.tsv.gz"
    timer = threading.Timer(2.0, lambda: (late / src.name).write_bytes(src.read_bytes()))
    timer.start()
    try:
        r = ingest_date(
            DAYS[0],
            layout=Layout(str(raw_root)),
            input=InputConfig(url=str(late / "day_{date}.tsv.gz"), wait_s=4, poll_s=0.5),
            ingest=SMALL_PARTS,
            client=client,
        )
    finally:
        timer.cancel()
    assert r.rows_written == ROWS_PER_DAY


def test_an_input_that_never_lands_fails_saying_how_long_it_waited_and_for_what(raw_root, client):
    (raw_root / "raw" / "_SUCCESS").unlink(missing_ok=True)
    with pytest.raises(FileNotFoundError, match=r"the done marker .*_SUCCESS is not there .* after waiting 1s"):
        ingest_date(
            DAYS[0],
            layout=Layout(str(raw_root)),
            input=InputConfig(wait_s=1, poll_s=0.3, done_file="_SUCCESS"),
            ingest=SMALL_PARTS,
            client=client,
        )


def test_real_avazu_sample_is_dated_by_its_hour(tmp_path, shared_data, client):
    text = (shared_data / "avazu" / "avazu_14102100.csv").read_text().splitlines(keepends=True)
    moved = [line.replace(",14102100,", ",14102200,") for line in text[-1000:]]  # the next day's rows
    path = tmp_path / "avazu.csv"
    path.write_text("".join(text[:-1000] + moved))
    kw = {
        "layout": Layout(str(tmp_path / "root")),
        "input": InputConfig(url=str(path), format="avazu"),
        "client": client,
    }
    r = ingest_date("2014-10-21", ingest=IngestConfig(rows_per_partition=4000), **kw)
    assert (r.rows_read, r.rows_written, r.rows_other_dates, r.rows_quarantined) == (9999, 8999, 1000, 0)
    assert set(events_of(tmp_path / "root", "2014-10-21")["ts"]) == {1413849600}
    with pytest.raises(IngestError, match="no rows of 2014-10-23") as info:
        ingest_date("2014-10-23", ingest=IngestConfig(), **kw)
    assert info.value.kind == "no_rows"


def test_a_large_plain_file_is_split_in_byte_ranges_with_true_line_numbers(tmp_path, raw_days, client):
    lines = criteo_text(raw_days, 4000).splitlines(True)
    for i in (7, 1999, 3998):
        lines[i] = b"bad\tline\n"
    (tmp_path / f"day_{DAYS[0]}.tsv").write_bytes(b"".join(lines))
    inp = InputConfig(url=str(tmp_path / "day_{date}.tsv"))
    kw = {"input": inp, "client": client}
    whole = ingest_date(
        DAYS[0],
        layout=Layout(str(tmp_path / "a")),
        ingest=IngestConfig(rows_per_partition=700, max_bad_fraction=0.01),
        **kw,
    )
    split = ingest_date(
        DAYS[0],
        layout=Layout(str(tmp_path / "b")),
        ingest=IngestConfig(rows_per_partition=700, max_bad_fraction=0.01, block_size=50_000),
        **kw,
    )
    manifest = json.loads((tmp_path / "b" / "events" / f"date={DAYS[0]}" / "_SUCCESS.json").read_text())
    assert manifest["blocks"] > 10 and (split.rows_written, split.rows_quarantined) == (whole.rows_written, 3)
    ev = [pd.read_parquet(tmp_path / r / "events" / f"date={DAYS[0]}") for r in ("a", "b")]
    pd.testing.assert_frame_equal(ev[0], ev[1])
    assert ev[1]["order"].is_monotonic_increasing
    assert read_quarantine(Layout(str(tmp_path / "b")), DAYS[0])["line"].tolist() == [8, 2000, 3999]


def test_a_quarantine_of_another_run_is_detected_and_the_date_is_redone(raw_root, client):
    kw = {"layout": Layout(str(raw_root)), "input": InputConfig(), "ingest": IngestConfig(), "client": client}
    ingest_date(DAYS[0], **kw)
    qm = raw_root / "quarantine" / f"date={DAYS[0]}" / "_SUCCESS.json"
    m = json.loads(qm.read_text())
    qm.write_text(json.dumps({**m, "events_run_id": "crashed-run"}))  # as if killed between the two commits
    with pytest.raises(IngestError, match="rerun the ingest") as info:
        read_quarantine(Layout(str(raw_root)), DAYS[0])
    assert info.value.kind == "inconsistent"
    assert not ingest_date(DAYS[0], **kw).skipped and len(read_quarantine(Layout(str(raw_root)), DAYS[0])) == 0
    assert ingest_date(DAYS[0], **kw).skipped
