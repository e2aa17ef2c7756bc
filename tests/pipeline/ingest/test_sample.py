"""pipeline.ingest.sample: a file's first lines read with a schema (what `ctrpipe check-schema` prints), and the
input check a run makes before anything starts (issue 52)."""

from __future__ import annotations

import gzip

import pytest

from pipeline.config import InputConfig
from pipeline.ingest.error import IngestError
from pipeline.ingest.sample import check_inputs, check_sample, read_sample
from pipeline.ingest.stage import find_inputs
from pipeline.schema import CRITEO, schema_from_dict

SPEC = {
    "separator": ",",
    "header": True,
    "columns": ["ip", "ts", "clicked", "app", "price"],
    "label": "clicked",
    "timestamp": {"column": "ts", "format": "%Y-%m-%d %H:%M:%S"},
    "integer": ["price"],
    "categorical": ["app"],
    "time_features": ["hour_of_day"],
}
HEADER = "ip,ts,clicked,app,price"
LINES = [f"{i},2026-03-0{1 + i // 10} 0{i % 10}:00:00,{int(i % 4 == 0)},a{i % 3},{i}" for i in range(20)]


def write(tmp_path, lines, name="clicks.csv", spec=None):
    (tmp_path / name).write_text("\n".join([HEADER, *lines]) + "\n")
    (tmp_path / "s.yaml").write_text(__import__("yaml").safe_dump(spec or SPEC))
    return InputConfig(url=str(tmp_path / "clicks.csv"), format=str(tmp_path / "s.yaml"))


def test_a_sample_counts_every_line_and_describes_every_column(tmp_path):
    lines = [*LINES, "20,not a time,0,a1,3", "21,2026-03-01 01:00:00,yes,a1,3"]
    write(tmp_path, lines)
    check = check_sample(
        read_sample(str(tmp_path / "clicks.csv")), schema_from_dict(SPEC), file="clicks.csv", date="2026-03-01"
    )
    assert (check.rows_read, check.rows_valid, check.rows_quarantined, check.rows_other_dates) == (22, 10, 2, 10)
    assert check.counts() == "22 rows read = 10 valid + 2 quarantined (9.09%) + 10 dated elsewhere" and check.fits
    roles = {c.name: (c.role, c.distinct) for c in check.columns}
    assert roles == {
        "ip": ("dropped", 22),
        "ts": ("timestamp", 21),
        "clicked": ("label", 3),
        "app": ("categorical", 3),
        "price": ("integer", 20),
        "hour_of_day": ("derived", 10),
    }
    notes = {c.name: c.note for c in check.columns}
    assert notes["clicked"] == "25.00% positive" and notes["price"] == "0 .. 19"
    assert notes["ts"] == "2026-03-01 00:00:00 .. 2026-03-02 09:00:00, 2 dates"
    problems = check.problems(schema_from_dict(SPEC), fmt="s.yaml")
    assert problems[0].startswith("bad timestamp x1, e.g. clicks.csv line 22: ts='not a time'")
    assert problems[-1].startswith("fix or remove the malformed rows")


def test_read_sample_reads_only_the_first_lines_of_a_compressed_file(tmp_path):
    (tmp_path / "big.tsv.gz").write_bytes(gzip.compress(b"".join(b"1\t2\n" for _ in range(50_000))))
    assert read_sample(str(tmp_path / "big.tsv.gz"), lines=10) == b"1\t2\n" * 10


def test_a_missing_input_is_reported_naming_the_date_and_url_unless_it_is_waited_for(tmp_path):
    inp = InputConfig(url=str(tmp_path / "day_{date}.csv"))
    urls = {"2026-03-01": str(tmp_path / "day_2026-03-01.csv")}
    with pytest.raises(FileNotFoundError, match=r"no input for 2026-03-01 at \S*day_2026-03-01\.csv: no file matches"):
        check_inputs(inp, urls, find=find_inputs)
    waited = InputConfig(url=inp.url, wait_s=600)
    assert check_inputs(waited, urls, find=find_inputs) is None  # ingest waits for it; nothing to check yet


def test_a_sample_the_schema_does_not_read_stops_the_run_with_ingest_s_reasons(tmp_path):
    inp = write(tmp_path, LINES, spec={**SPEC, "timestamp": {"column": "ts", "format": "%d/%m/%Y %H:%M"}})
    with pytest.raises(ValueError) as info:
        check_inputs(inp, {"2026-03-01": inp.url}, find=find_inputs)
    lines = str(info.value).splitlines()
    assert lines[0].endswith("clicks.csv: 20 rows read = 0 valid + 20 quarantined (100.00%) + 0 dated elsewhere")
    assert "bad timestamp x20" in lines[1] and "fix timestamp.format in the schema file" in lines[2]
    assert "ctrpipe check-schema" in lines[-1]


def test_a_header_of_other_columns_stops_the_run_naming_the_separator(tmp_path):
    inp = write(tmp_path, LINES, spec={**SPEC, "separator": ";"})
    with pytest.raises(ValueError, match=r"line 1 is the header of the s columns split on ','"):
        check_inputs(inp, {"2026-03-01": inp.url}, find=find_inputs)


def test_a_file_of_several_days_is_looked_for_once_and_sampled_once(tmp_path):
    inp = write(tmp_path, LINES)
    seen = []

    def find(url):
        seen.append(url)
        return find_inputs(url)

    check = check_inputs(inp, {"2026-03-01": inp.url, "2026-03-02": inp.url}, find=find)
    assert seen == [inp.url] and check is not None and check.rows_read == 20
    assert check.rows_other_dates == 0  # the URL names no date: the sample is not dated


def test_a_criteo_day_with_a_few_bad_lines_passes(tmp_path, raw_days):
    url = str(raw_days.path / "day_2026-01-01.tsv.gz")
    check = check_inputs(InputConfig(url=url), {"2026-01-01": url}, find=find_inputs)
    assert check is not None and check.fits and check.rows_read == 1000 and check.rows_valid == 1000
    assert {c.role for c in check.columns} == {"label", "integer", "categorical"} and len(check.columns) == 40
    assert CRITEO.request_columns == CRITEO.columns[1:]


def test_a_truncated_compressed_input_is_reported_before_the_run(tmp_path, raw_days):
    whole = (raw_days.path / "day_2026-01-01.tsv.gz").read_bytes()
    cut = tmp_path / "day_2026-01-01.tsv.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])  # its first lines still read: only the end shows the cut
    url = str(cut)
    with pytest.raises(IngestError, match=r"day_2026-01-01\.tsv\.gz: cannot decompress \(gzip\): .*truncated") as info:
        check_inputs(InputConfig(url=url), {"2026-01-01": url}, find=find_inputs)
    assert info.value.kind == "corrupt_input"
