"""One file holding several days: every row read is written, quarantined or dated elsewhere, and the ingest line,
the error of a day with too many bad rows, the result and the manifest all say so (issue 52)."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.config import IngestConfig, InputConfig
from pipeline.ingest.error import IngestError
from pipeline.ingest.stage import ingest_date
from storage.io.layout import Layout

DAYS = ("2026-03-11", "2026-03-12", "2026-03-13", "2026-03-14")
PER_DAY = 250
COLUMNS = "ip,app,os,click_time,attributed_time,is_attributed"
SCHEMA = """name: talk
separator: ","
header: true
columns: [ip, app, os, click_time, attributed_time, is_attributed]
label: is_attributed
categorical: [app, os]
timestamp: {{column: click_time, format: "{fmt}"}}
"""
WRONG = "%Y-%d-%m %H:%M:%S"
"""Day and month swapped: 03-11 reads as 11 March -> 3 November, 03-12 as 3 December, 03-13 and 03-14 not at all."""
EQUATION = re.compile(r"(\d+) rows read = (\d+) (?:valid|written) \+ (\d+) quarantined (?:\([\d.]+%\) )?\+ (\d+) dated")


def clicks(tmp_path, fmt: str) -> InputConfig:
    """DAYS x PER_DAY rows in one CSV, in time order, and its schema with timestamp format `fmt`."""
    lines = [COLUMNS]
    for d in DAYS:
        for i in range(PER_DAY):
            t = f"{d} {i % 24:02d}:{i % 60:02d}:{i * 7 % 60:02d}"
            positive = i % 97 == 0
            lines.append(f"{i},{i % 13},{i % 5},{t},{t if positive else ''},{int(positive)}")
    (tmp_path / "clicks.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "talk.yaml").write_text(SCHEMA.format(fmt=fmt))
    return InputConfig(url=str(tmp_path / "clicks.csv"), format=str(tmp_path / "talk.yaml"))


def adds_up(text: str) -> tuple[int, int, int, int]:
    read, written, quarantined, elsewhere = (int(n) for n in EQUATION.search(text).groups())  # type: ignore[union-attr]
    assert read == written + quarantined + elsewhere, text
    return read, written, quarantined, elsewhere


def test_a_wrong_time_pattern_on_a_file_of_several_days_accounts_for_every_row(tmp_path, client):
    inp, layout = clicks(tmp_path, WRONG), Layout(str(tmp_path / "root"))
    with pytest.raises(IngestError) as info:
        ingest_date("2026-11-03", layout=layout, input=inp, ingest=IngestConfig(), client=client)
    first = str(info.value).splitlines()[0]
    assert adds_up(first) == (4 * PER_DAY, PER_DAY, 2 * PER_DAY, PER_DAY), first
    assert "(50.00%)" in first and "over ingest.max_bad_fraction=0.01" in first  # the share of the rows read

    r = ingest_date("2026-11-03", layout=layout, input=inp, ingest=IngestConfig(max_bad_fraction=1.0), client=client)
    counts = (r.rows_read, r.rows_written, r.rows_quarantined, r.rows_other_dates)
    assert counts == (4 * PER_DAY, PER_DAY, 2 * PER_DAY, PER_DAY)
    assert adds_up(r.summary()) == counts and r.summary().startswith("ingest 2026-11-03: 1000 rows read = ")
    manifest = json.loads((tmp_path / "root" / "events" / "date=2026-11-03" / "_SUCCESS.json").read_text())
    assert [manifest[k] for k in ("rows_read", "rows_written", "rows_quarantined", "rows_other_dates")] == list(counts)


def test_each_date_of_a_file_of_several_days_gets_its_rows_and_says_where_the_others_went(tmp_path, client):
    inp, layout = clicks(tmp_path, "%Y-%m-%d %H:%M:%S"), Layout(str(tmp_path / "root"))
    for date in DAYS:
        r = ingest_date(date, layout=layout, input=inp, ingest=IngestConfig(), client=client)
        assert adds_up(r.summary()) == (4 * PER_DAY, PER_DAY, 0, 3 * PER_DAY)
        assert r.summary().endswith(f"{3 * PER_DAY} dated elsewhere")


def test_an_edited_schema_file_ingests_the_date_again(tmp_path, client):
    inp, layout = clicks(tmp_path, "%Y-%m-%d %H:%M:%S"), Layout(str(tmp_path / "root"))
    kw = {"layout": layout, "input": inp, "ingest": IngestConfig(), "client": client}
    assert not ingest_date(DAYS[0], **kw).skipped
    assert ingest_date(DAYS[0], **kw).skipped
    schema = tmp_path / "talk.yaml"
    schema.write_text(schema.read_text() + "time_features: [hour_of_day]\n")
    from pipeline.schema import load_schema_file

    load_schema_file.cache_clear()  # the file changed under the same name
    again = ingest_date(DAYS[0], **kw)
    assert not again.skipped and again.rows_written == PER_DAY
