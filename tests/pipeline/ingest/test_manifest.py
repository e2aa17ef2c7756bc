"""pipeline.ingest.manifest: the events and quarantine manifests round-trip, the manifests written before they
had a version read as version 1, unknown fields are ignored, a newer version is refused saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import pytest

from pipeline.ingest.manifest import (
    EVENTS_FORMAT,
    QUARANTINE_FORMAT,
    EventsManifest,
    FormatError,
    Part,
    QuarantineManifest,
    committed_events,
    read_events_manifest,
    read_quarantine_manifest,
)
from storage.io import codec, fsio
from storage.io.layout import Layout
from tests.helpers.formats import newer, sample

EVENTS = EventsManifest(
    date="2026-01-04",
    format="criteo",
    schema_digest="b5d9f3c5dbd0b866",
    rows_read=10,
    rows_written=7,
    rows_quarantined=2,
    rows_other_dates=1,
    rows_padded=3,
    stats={"rows": 7, "clicks": 2, "missing": {"I1": 1}, "dense_hist": {"I1": [0, 7]}},
    parts=(Part("part-00000-00000-00000.parquet", 4), Part("part-00000-00000-00001.parquet", 3)),
    reasons={"bad label": 2},
    inputs=({"url": "/raw/day_2026-01-04.tsv.gz", "size": 123, "mtime": 1.5},),
    slow_chunks=1,
    run_id="r1",
    quarantine_run_id="r1",
    code_version="abc",
    rows_per_partition=4,
    blocks=1,
)
QUARANTINE = QuarantineManifest(
    date="2026-01-04",
    rows_quarantined=2,
    parts=(Part("part-00000-00000-00000.parquet", 2),),
    reasons={"bad label": 2},
    samples={"bad label": {"file": "/raw/day_2026-01-04.tsv.gz", "line": 3, "raw": "x\t1", "reason": "bad label"}},
    run_id="r1",
    events_run_id="r1",
    code_version="abc",
)

# what pipeline.ingest.stage wrote before the manifests had a version (the code of 2026-12-07)
EVENTS_V1 = sample("events-manifest-v1.json")
QUARANTINE_V1 = sample("quarantine-manifest-v1.json")


@pytest.mark.parametrize("manifest", [EVENTS, QUARANTINE], ids=["events", "quarantine"])
def test_a_manifest_round_trips_through_json(manifest: EventsManifest | QuarantineManifest) -> None:
    data = json.loads(json.dumps(manifest.to_dict()))
    assert data["manifest_format"] == manifest.manifest_format and "data" not in data
    assert type(manifest).from_dict(data, where="m.json") == manifest


def test_the_events_manifest_without_a_version_reads_as_version_1() -> None:
    m = EventsManifest.from_dict(EVENTS_V1, where="m.json")
    assert m.manifest_format == EVENTS_FORMAT.tag == "ctr-pipeline-events/1"
    assert (m.date, m.format, m.rows_read, m.rows_written, m.rows_quarantined) == ("2026-04-02", "criteo", 42, 40, 2)
    assert m.parts == tuple(Part(**p) for p in EVENTS_V1["parts"]) and sum(p.rows for p in m.parts) == m.rows_written
    assert m.run_id == m.quarantine_run_id == EVENTS_V1["run_id"] and m.reasons == EVENTS_V1["reasons"]
    assert list(m.inputs) == EVENTS_V1["inputs"] and m.stats == EVENTS_V1["stats"] and m.blocks == 1
    assert m.schema_digest == ""  # not recorded then: any schema of the format's name matches
    assert json.loads(json.dumps(m.to_dict())) == {
        **EVENTS_V1,
        "manifest_format": "ctr-pipeline-events/1",
        "schema_digest": "",
    }


def test_the_quarantine_manifest_without_a_version_reads_as_version_1() -> None:
    m = QuarantineManifest.from_dict(QUARANTINE_V1, where="m.json")
    assert m.manifest_format == QUARANTINE_FORMAT.tag == "ctr-pipeline-quarantine/1"
    assert m.events_run_id == EVENTS_V1["run_id"] and m.rows_quarantined == 2 and len(m.parts) == 1
    assert m.samples["wrong field count"]["line"] == 6 and m.reasons == QUARANTINE_V1["reasons"]
    assert json.loads(json.dumps(m.to_dict())) == {**QUARANTINE_V1, "manifest_format": "ctr-pipeline-quarantine/1"}


def test_unknown_fields_are_ignored() -> None:
    assert EventsManifest.from_dict(newer(EVENTS_V1, stats="share_of_a_later_release"), where="m.json").stats[
        "share_of_a_later_release"
    ]  # a free-form mapping keeps its keys
    data = newer(EVENTS_V1)
    data["parts"][0]["checksum_of_a_later_release"] = "abc"
    assert EventsManifest.from_dict(data, where="m.json") == EventsManifest.from_dict(EVENTS_V1, where="m.json")
    q = newer(QUARANTINE_V1)
    assert QuarantineManifest.from_dict(q, where="m.json") == QuarantineManifest.from_dict(
        QUARANTINE_V1, where="m.json"
    )


@pytest.mark.parametrize(
    ("cls", "data", "name"),
    [(EventsManifest, EVENTS_V1, "events"), (QuarantineManifest, QUARANTINE_V1, "quarantine")],
    ids=["events", "quarantine"],
)
def test_a_newer_version_is_refused_naming_the_file_and_what_to_do(cls: type, data: dict, name: str) -> None:
    with pytest.raises(
        FormatError,
        match=rf"/e/_SUCCESS\.json has format 'ctr-pipeline-{name}/2', written by a "
        r"newer ctr-pipeline.*upgrade ctr-pipeline.*ingest stage.*--force",
    ):
        cls.from_dict({**data, "manifest_format": f"ctr-pipeline-{name}/2"}, where="/e/_SUCCESS.json")


def test_another_files_format_and_a_wrong_type_are_refused() -> None:
    with pytest.raises(FormatError, match="not a ctr-pipeline-events file"):
        EventsManifest.from_dict({"manifest_format": "ctr-pipeline-quarantine/1"}, where="m.json")
    with pytest.raises(codec.ConfigError, match="rows_written must be an integer"):
        EventsManifest.from_dict({**EVENTS_V1, "rows_written": "forty"}, where="m.json")
    with pytest.raises(codec.ConfigError, match=r"parts\[0\].rows must be an integer"):
        QuarantineManifest.from_dict({**QUARANTINE_V1, "parts": [{"name": "p", "rows": "two"}]}, where="m.json")


def test_the_readers_read_the_committed_manifests(tmp_path: Path) -> None:
    fs = fsspec.filesystem("file")
    layout = Layout(str(tmp_path))
    events = layout.fs(layout.events("2026-01-04"))[1]
    assert read_events_manifest(fs, events) is None and read_quarantine_manifest(fs, str(tmp_path / "q")) is None
    with pytest.raises(FileNotFoundError, match="no committed events for 2026-01-04 at .*: run ingest first"):
        committed_events(layout, "2026-01-04")
    for path, manifest in ((events, EVENTS), (str(tmp_path / "q"), QUARANTINE)):
        fs.makedirs(path, exist_ok=True)
        fsio.write_json(fs, f"{path}/{fsio.SUCCESS}", manifest.to_dict())
    assert read_events_manifest(fs, events) == EVENTS
    assert read_quarantine_manifest(fs, str(tmp_path / "q")) == QUARANTINE
    _, path, manifest = committed_events(layout, "2026-01-04")
    assert manifest == EVENTS and manifest.part_urls(path) == [f"{path}/{p.name}" for p in EVENTS.parts]
