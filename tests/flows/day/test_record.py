"""metrics.json (`flows.day.record.DayRecord`) is read by later releases: today's files, a newer writer's
fields and a retired field are read; a version this code does not read is refused naming it."""

from __future__ import annotations

import json

import pytest

from flows.day.record import DAY_RECORD, DayRecord, Status, read_record, write_record
from storage.io.layout import Layout
from storage.io.records import FormatError
from tests.helpers.formats import newer, sample


def test_a_metrics_json_as_written_today_without_a_format_is_version_1():
    record = DayRecord.from_dict(sample("day-record-v1.json"))
    assert record.format == DAY_RECORD.tag == "ctr-pipeline-day-record/1"
    assert record.status is Status.PUBLISHED and record.completed and record.auc is not None and record.seconds


def test_unknown_fields_and_retired_ones_are_ignored():
    data = newer(sample("day-record-v1.json"))
    data["slot_wait"] = 3.0  # a field a later release retired reads the same as one it added
    assert DayRecord.from_dict(data) == DayRecord.from_dict(sample("day-record-v1.json"))
    with_stat = DayRecord.from_dict(newer(sample("day-record-v1.json"), train="retired_stat"))
    assert with_stat.train["retired_stat"] == "retired value"  # a free-form section keeps what it held


def test_a_newer_version_is_refused_naming_the_file_and_what_to_do():
    with pytest.raises(
        FormatError,
        match=r"/r/metrics.json has format 'ctr-pipeline-day-record/2', written by a "
        r"newer ctr-pipeline; this code reads ctr-pipeline-day-record/1: upgrade",
    ):
        DayRecord.from_dict(
            {**sample("day-record-v1.json"), "format": "ctr-pipeline-day-record/2"}, where="/r/metrics.json"
        )


def test_the_writer_stamps_its_format_and_round_trips(tmp_path):
    layout = Layout(str(tmp_path), "ctr")
    record = DayRecord.from_dict(sample("day-record-v1.json"))
    write_record(layout, record)
    on_disk = json.loads((tmp_path / "runs" / "ctr" / "date=2026-04-02" / "metrics.json").read_text())
    assert on_disk["format"] == "ctr-pipeline-day-record/1"
    assert read_record(layout, "2026-04-02") == record
    assert on_disk.keys() >= sample("day-record-v1.json").keys()  # every field today's readers know is written
