"""A day a guard stops is an expected outcome, reported as one: a stopped day's real Prefect run (session server).

The first day of a root arrives with every row cut short, so the `padded_rows` data check stops it
before training.  The run goes through Prefect's engine as a worker runs it (`run_flow` with the run's
error logger): its state is `DataCheckFailed` with a message naming the check, its log carries no
"Engine execution exited with unexpected exception" traceback (it carried a 10,000-character one of a
`TypeError`: a dict cannot be resolved into an exception), and a caller asking for its result gets a
`GuardStopped` naming the same.  What the run leaves for people and scrapers names the real LATEST
(not `None`): the Prometheus textfile and the artifact, a markdown table keyed by model and root.
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.flow_engine import run_flow
from prometheus_client.parser import text_string_to_metric_families

from flows.config import RunConfig, with_overrides
from flows.prefect.artifact import artifact_key
from flows.prefect.daily import GuardStopped, daily_retrain, record_of
from flows.prefect.keys import model_key
from flows.presets import demo
from pipeline.generate import generate_days

# two flow runs of a small day (~40 s on 2 cores), on the session's Prefect server
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_in_process")]

DATE = "2026-02-01"


def _stopped_day(tmp: Path) -> RunConfig:
    """A root whose LATEST is v00003 and whose input for DATE has every row cut to 20 of 40 fields."""
    root, raw = tmp / "root", tmp / "raw"
    generate_days(str(raw), 1, 600, seed=3, start_date=DATE)
    lines = gzip.decompress((raw / f"day_{DATE}.tsv.gz").read_bytes()).splitlines()
    (raw / f"day_{DATE}.tsv").write_bytes(b"".join(b"\t".join(x.split(b"\t")[:20]) + b"\n" for x in lines))
    (root / "models" / "ctr").mkdir(parents=True)
    (root / "models" / "ctr" / "LATEST").write_text("v00003\n")  # what LATEST names, whatever made it
    return with_overrides(
        demo(str(root)), {"input.url": str(raw / "day_{date}.tsv"), "dask.processes": False, "dask.n_workers": 1}
    )


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, prefect_in_process):
    cfg = _stopped_day(tmp_path_factory.mktemp("guard-outcome"))
    engine_log = logging.getLogger("prefect.flow_runs")  # the logger a worker's engine reports through
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(level=logging.DEBUG)
    engine_log.addHandler(keep)
    try:
        with pytest.raises(GuardStopped) as raised:  # a caller asking for the result, as the worker's engine does
            run_flow(daily_retrain, parameters={"date": DATE, "config": cfg.to_dict()}, error_logger=engine_log)
        state = daily_retrain(DATE, config=cfg.to_dict(), force=True, return_state=True)
    finally:
        engine_log.removeHandler(keep)
    return cfg, raised.value, state, records


def test_the_run_ends_in_data_check_failed_with_one_clear_message(stopped_run):
    cfg, error, state, _ = stopped_run
    assert state.is_failed() and state.name == "DataCheckFailed"
    assert state.message.startswith(f"model ctr, {DATE}: stopped before training: ") and "padded_rows" in state.message
    assert str(error) == state.message
    assert error.record["status"] == "check_failed"
    record = record_of(state, cfg.layout(), DATE)
    assert record is not None and record.status == "check_failed" and "padded_rows" in record.reason


def test_no_engine_traceback_in_the_log(stopped_run):
    _, _, _, records = stopped_run
    messages = [r.getMessage() for r in records]
    assert not [m for m in messages if "Engine execution exited with unexpected exception" in m], messages
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records if r.exc_info]
    assert not [m for m in messages if "cannot be resolved into an exception" in m]


def test_the_textfile_names_the_outcome_and_the_real_latest(stopped_run):
    cfg, _, _, _ = stopped_run
    text = Path(cfg.layout().metrics_textfile()).read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    info = families["ctrpipe_run_info"].samples[0].labels
    assert info["status"] == "check_failed" and info["latest"] == "v00003" and info["date"] == DATE
    status = {s.labels["status"]: s.value for s in families["ctrpipe_run_status"].samples}
    assert status == {"published": 0, "refused": 0, "check_failed": 1, "failed": 0}
    rows = {s.labels["kind"]: s.value for s in families["ctrpipe_run_rows"].samples}
    assert rows["read"] == 600 and "ctrpipe_run_auc" not in families  # nothing trained
    assert {s.labels["stage"] for s in families["ctrpipe_run_stage_seconds"].samples} >= {"ingest", "vocab", "checks"}


def test_the_artifact_is_keyed_by_model_and_root_and_shows_the_real_latest(stopped_run):
    cfg, _, _, _ = stopped_run
    key = artifact_key(cfg, DATE)
    assert model_key(cfg.layout()) in key
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, key
    markdown = found[-1].data
    assert "| model version | none (LATEST = v00003) |" in markdown, markdown
    assert f"| {DATE} | check_failed |" in markdown  # the last days as a table the UI shows
    assert "![the checked data series](data:image/png;base64," in markdown  # the chart itself, not a local path
