"""The last daily run as a Prometheus textfile: what node-exporter's textfile collector reads, parsed by the
Prometheus client's own parser; replaced whole, run after run."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from flows.day.record import DayRecord, Status
from flows.metrics import textfile
from storage.io.layout import Layout, root_digest

PUBLISHED = DayRecord(
    date="2026-01-03",
    completed=True,
    status=Status.PUBLISHED,
    reason='all checks "passed"\nsee gate',
    auc=0.7712,
    logloss=0.4521,
    published_auc=0.7701,
    rows_read=3000,
    rows_ingested=2998,
    rows_quarantined=2,
    vocab_size=4100,
    rows_train=2700,
    rows_eval=298,
    published=True,
    model_version="v00003",
    latest_version="v00003",
    seconds={"ingest": 1.5, "train": 20.25},
    wall_s=30.0,
)


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_published_day_is_every_number_a_scraper_needs():
    text = textfile.render(
        PUBLISHED, model="ctr", root="abc123", latest="v00003", config_digest="d1", written_at=1767398400.0
    )
    families = _families(text)
    assert all(f.type == "gauge" for f in families.values())
    assert all(
        s.labels["model"] == "ctr" and s.labels["root"] == "abc123" for f in families.values() for s in f.samples
    )
    info = families["ctrpipe_run_info"].samples[0].labels
    assert (info["date"], info["status"], info["version"], info["latest"], info["config"]) == (
        "2026-01-03",
        "published",
        "v00003",
        "v00003",
        "d1",
    )
    assert families["ctrpipe_run_auc"].samples[0].value == 0.7712
    assert families["ctrpipe_run_published"].samples[0].value == 1
    assert {s.labels["stage"]: s.value for s in families["ctrpipe_run_stage_seconds"].samples} == {
        "ingest": 1.5,
        "train": 20.25,
    }
    assert {s.labels["kind"]: s.value for s in families["ctrpipe_run_rows"].samples}["quarantined"] == 2
    assert families["ctrpipe_run_date_timestamp_seconds"].samples[0].value == 1767398400.0  # 2026-01-03 00:00 UTC
    assert text.endswith("\n")


def test_a_failed_day_has_no_model_numbers_and_says_so():
    failed = DayRecord(
        date="2026-01-04",
        completed=False,
        status=Status.FAILED,
        reason="FileNotFoundError: no input",
        failed_stage="ingest",
        seconds={"ingest": 0.2},
    )
    families = _families(textfile.render(failed, model="ctr", root="r", latest="v00003", written_at=1.0))
    assert "ctrpipe_run_auc" not in families and "ctrpipe_run_published_auc" not in families
    status = {s.labels["status"]: s.value for s in families["ctrpipe_run_status"].samples}
    assert status == {"published": 0, "refused": 0, "check_failed": 0, "failed": 1}


def test_the_file_sits_under_the_root_and_is_replaced_whole(tmp_path):
    layout = Layout(str(tmp_path / "root"), "ctr")
    url = textfile.write(layout, PUBLISHED, latest="v00003", written_at=1.0)
    assert url == str(tmp_path / "root" / "metrics" / "ctr.prom")
    first = os.stat(url).st_ino
    failed = DayRecord(date="2026-01-04", completed=False, status=Status.FAILED, reason="x")
    textfile.write(layout, failed, latest="v00003", written_at=2.0)
    assert os.stat(url).st_ino != first  # a new file renamed over the old one: a reader never sees half of one
    assert os.listdir(tmp_path / "root" / "metrics") == ["ctr.prom"]  # no temporary file left
    families = _families(Path(url).read_text())
    assert families["ctrpipe_run_info"].samples[0].labels["date"] == "2026-01-04"
    assert families["ctrpipe_run_info"].samples[0].labels["root"] == root_digest(str(tmp_path / "root"))


FAMILIES = {
    "ctrpipe_run_info": {"model", "root", "date", "status", "version", "latest", "config"},
    "ctrpipe_run_completion_timestamp_seconds": {"model", "root"},
    "ctrpipe_run_date_timestamp_seconds": {"model", "root"},
    "ctrpipe_run_status": {"model", "root", "status"},
    "ctrpipe_run_published": {"model", "root"},
    "ctrpipe_run_stage_seconds": {"model", "root", "stage"},
    "ctrpipe_run_wall_seconds": {"model", "root"},
    "ctrpipe_run_rows": {"model", "root", "kind"},
    "ctrpipe_run_vocab_size": {"model", "root"},
    "ctrpipe_run_auc": {"model", "root"},
    "ctrpipe_run_logloss": {"model", "root"},
    "ctrpipe_run_published_auc": {"model", "root"},
}
"""Family -> the label names of its samples, as the textfile had them before prometheus_client."""


def test_the_textfile_is_prometheus_clients_exposition_of_a_registry_of_its_own():
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

    args = {"model": "ctr", "root": "abc123", "latest": "v00003", "config_digest": "d1", "written_at": 1767398400.5}
    registry = textfile.collect(PUBLISHED, **args)
    assert isinstance(registry, CollectorRegistry) and registry is not textfile.collect(PUBLISHED, **args)
    text = textfile.render(PUBLISHED, **args)
    assert text == generate_latest(registry).decode()
    assert "ctrpipe_run" not in generate_latest(REGISTRY).decode()  # nothing in prometheus_client's global registry
    families = _families(text)
    assert {name: {k for s in f.samples for k in s.labels} for name, f in families.items()} == FAMILIES
    assert families["ctrpipe_run_completion_timestamp_seconds"].samples[0].value == 1767398400.5
