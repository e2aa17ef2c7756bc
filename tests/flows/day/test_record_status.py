"""flows.day.record.Status: metrics.json keeps the plain status strings, a record read back holds the member,
and a status this code does not know fails naming it."""

from __future__ import annotations

import json

import pytest

from flows.day.record import DayRecord, Status
from storage.io import codec


def test_status_is_written_as_its_string_and_read_back_as_the_member() -> None:
    record = DayRecord(date="2026-01-05", completed=False, status=Status.CHECK_FAILED, reason="rows dropped")
    data = json.loads(json.dumps(record.to_dict()))
    assert data["status"] == "check_failed" and type(record.to_dict()["status"]) is str
    back = DayRecord.from_dict(data)
    assert back.status is Status.CHECK_FAILED and back == record


def test_the_strings_of_todays_files_are_the_members() -> None:
    assert [str(s) for s in Status] == ["published", "refused", "check_failed", "failed"]
    record = DayRecord.from_dict({"date": "2026-01-05", "completed": True, "status": "published", "reason": ""})
    assert record.status is Status.PUBLISHED and record.status == "published"


def test_an_unknown_status_names_the_value_and_the_known_ones() -> None:
    with pytest.raises(
        codec.ConfigError, match="status 'paused' is not one of published, refused, check_failed, failed"
    ):
        DayRecord.from_dict({"date": "2026-01-05", "completed": False, "status": "paused", "reason": ""})
