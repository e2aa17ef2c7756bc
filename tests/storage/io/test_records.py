"""Persisted records: the versions a reader takes, what it says about the others, and tolerant decoding."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from storage.io.codec import ConfigError
from storage.io.records import FormatError, RecordFormat, read_record

FMT = RecordFormat("ctr-thing", 2, reads=(1, 2), absent=1, fix="rebuild the thing")


@dataclass(frozen=True, kw_only=True)
class Thing:
    format: str = FMT.tag
    name: str
    size: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def test_the_versions_read_and_a_file_from_before_the_format_field():
    assert FMT.tag == "ctr-thing/2"
    assert FMT.version_of({"format": "ctr-thing/1"}, "f") == 1
    assert FMT.version_of({"format": "ctr-thing/2"}, "f") == 2
    assert FMT.version_of({}, "f") == 1  # written before records had a format
    with pytest.raises(FormatError, match="has format None, not a ctr-thing file"):
        RecordFormat("ctr-thing", 1).version_of({}, "f")  # no `absent`: a format is required


def test_a_newer_an_older_and_a_foreign_version_are_refused_saying_what_to_do():
    with pytest.raises(FormatError) as newer:
        FMT.version_of({"format": "ctr-thing/3"}, "/r/thing.json")
    assert str(newer.value) == (
        "/r/thing.json has format 'ctr-thing/3', written by a newer ctr-pipeline; this code "
        "reads ctr-thing/1, ctr-thing/2: upgrade ctr-pipeline here to read it"
    )
    with pytest.raises(FormatError, match=r"format 'ctr-thing/0', too old .* reads ctr-thing/1, ctr-thing/2: rebuild"):
        FMT.version_of({"format": "ctr-thing/0"}, "/r/thing.json")
    with pytest.raises(FormatError, match="format 'other/2', not a ctr-thing file"):
        FMT.version_of({"format": "other/2"}, "/r/thing.json")


def test_a_record_ignores_fields_it_does_not_know_and_names_a_wrong_type():
    got = read_record(Thing, {"name": "a", "later": {"x": 1}, "extra": {"k": 3}}, fmt=FMT, where="/r/thing.json")
    assert got == Thing(name="a", extra={"k": 3})
    with pytest.raises(ConfigError, match=r"/r/thing.json: size must be an integer"):
        read_record(Thing, {"name": "a", "size": "big"}, fmt=FMT, where="/r/thing.json")
    with pytest.raises(FormatError, match="not a JSON object"):
        read_record(Thing, [1], fmt=FMT, where="/r/thing.json")
    with pytest.raises(FormatError, match="newer ctr-pipeline"):
        read_record(Thing, {"name": "a", "format": "ctr-thing/9"}, fmt=FMT, where="/r/thing.json")
