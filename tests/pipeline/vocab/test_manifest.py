"""pipeline.vocab.manifest: the vocab manifest round-trips, today's manifest (no version) reads as version 1,
unknown fields are ignored, a newer version is refused saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from pipeline.vocab.manifest import (
    VOCAB_FORMAT,
    DayFieldStats,
    FieldStats,
    FormatError,
    VocabManifest,
    read_vocab_manifest,
)
from storage.io import codec, fsio
from tests.helpers.formats import newer, sample

FULL = VocabManifest(
    date="2026-01-04",
    format="criteo",
    config={"window_days": 3, "min_count": 2, "min_count_per_field": {"C7": 4}},
    window_dates=("2026-01-03", "2026-01-04"),
    window_runs={"2026-01-03": "r0", "2026-01-04": "r1"},
    previous_vocab_date="2026-01-03",
    merge="delta",
    buckets=4,
    day_rows=1000,
    day_keys=300,
    vocab_rows=700,
    admitted=500,
    seen=650,
    evicted=7,
    per_field=(
        FieldStats("C1", seen=10, admitted=8, evicted=1, coverage=0.9, oov_rate=0.05, missing_rate=0.05),
        FieldStats("T1", seen=3, admitted=3, coverage=1.0),
    ),
    day_fields=(DayFieldStats("C1", day_keys=9, oov_rate_previous=0.1),),
    seconds={"count": 0.5, "merge": 1.25, "evicted_and_report": 0.1},
    events_run_id="e1",
    run_id="r1",
    code_version="abc",
)

# what pipeline.vocab.stage wrote before the manifest had a version (written by the code of 2026-12-02)
TODAY = sample("vocab-manifest-v1.json")


def test_a_manifest_round_trips_through_json() -> None:
    data = json.loads(json.dumps(FULL.to_dict()))
    assert data["manifest_format"] == "ctr-pipeline-vocab/1" and "data" not in data
    assert VocabManifest.from_dict(data, where="m.json") == FULL


def test_todays_manifest_without_a_version_reads_as_version_1() -> None:
    m = VocabManifest.from_dict(TODAY, where="m.json")
    assert m.manifest_format == VOCAB_FORMAT.tag and m.format == "criteo" and m.date == "2026-04-02"
    assert (m.merge, m.buckets, m.previous_vocab_date) == ("delta", 2, "2026-04-01")
    assert m.window_dates == ("2026-04-01", "2026-04-02") and m.window_runs["2026-04-02"] == m.run_id
    assert m.config["window_days"] == 3 and len(m.per_field) == len(m.day_fields) == 26
    assert m.per_field[0] == FieldStats(**TODAY["per_field"][0]) and m.admitted == 1321
    assert json.loads(json.dumps(m.to_dict())) == {**TODAY, "manifest_format": "ctr-pipeline-vocab/1"}


def test_unknown_fields_are_ignored() -> None:
    data = newer(TODAY)
    data["per_field"][0]["share_of_a_later_release"] = 0.5
    assert VocabManifest.from_dict(data, where="m.json") == VocabManifest.from_dict(TODAY, where="m.json")


def test_a_newer_version_is_refused_naming_the_file_and_what_to_do() -> None:
    with pytest.raises(
        FormatError,
        match=r"/v/_SUCCESS\.json has format 'ctr-pipeline-vocab/2', written by a "
        r"newer ctr-pipeline.*upgrade ctr-pipeline.*vocab stage.*--force",
    ):
        VocabManifest.from_dict({**TODAY, "manifest_format": "ctr-pipeline-vocab/2"}, where="/v/_SUCCESS.json")


def test_another_files_format_and_a_wrong_type_are_refused() -> None:
    with pytest.raises(FormatError, match="not a ctr-pipeline-vocab file"):
        VocabManifest.from_dict({"manifest_format": "ctr-pipeline-features/1"}, where="m.json")
    with pytest.raises(codec.ConfigError, match="buckets must be an integer"):
        VocabManifest.from_dict({**TODAY, "buckets": "two"}, where="m.json")


def test_read_vocab_manifest_reads_the_committed_one(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    assert read_vocab_manifest(fs, str(tmp_path)) is None
    fsio.write_json(fs, str(tmp_path / fsio.SUCCESS), FULL.to_dict())
    assert read_vocab_manifest(fs, str(tmp_path)) == FULL
