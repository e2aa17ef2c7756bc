"""`run_day`: one date, every stage in order, without Prefect; a rerun resumes what a crash left.

The run identity names what changes the trained model (`TrainSpec.identity`), so rerunning a day
that died in training with another timeout or another Dask size resumes from that day's own
checkpoints instead of training again from the start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import with_overrides
from flows.day import STAGES, run_day
from flows.recipes import demo
from flows.record import read_record
from pipeline.generate import generate_days
from storage.io.registry import ModelRegistry
from trainer.launch import TrainingError
from trainer.model_dir import read_meta

pytestmark = pytest.mark.slow

DATE = "2026-02-01"


def _config(tmp_path: Path, **overrides):
    generate_days(str(tmp_path / "raw"), 1, 3000, seed=5, start_date=DATE)
    return with_overrides(demo(str(tmp_path / "root")), {
        "input.url": str(tmp_path / "raw" / "day_{date}.tsv.gz"),
        "dask.processes": False,
        "dask.n_workers": 2,
        "optim.batch_size": 128,
        **overrides,
    })


def test_a_day_runs_every_stage_in_order_and_publishes_without_prefect(tmp_path):
    cfg = _config(tmp_path)
    day = run_day(cfg, DATE)
    record = day.record
    assert day.ran and record.completed and record.status == "published" and record.model_version == "v00001"
    assert list(record.seconds) == [s.name for s in STAGES]  # each stage ran once, in order
    assert record == read_record(cfg.layout(), DATE)  # what was written is what was returned
    assert ModelRegistry(cfg.layout()).latest() == "v00001"
    # the optim values were derived for the day's 2,700 train rows; model.json and metrics.json say so
    recipe, meta = record.train["recipe"], read_meta(cfg.layout().run_model(DATE))
    assert meta.recipe == recipe and recipe["rows"] == record.rows_train
    assert recipe["values"]["optim.epochs"] == meta.optim.epochs > 1 and "optim.epochs" in recipe["derived"]
    assert recipe["values"]["optim.batch_size"] == 128 and "optim.batch_size" not in recipe["derived"]  # set
    assert record.train["steps"] == recipe["steps"]
    again = run_day(cfg, DATE)
    assert not again.ran and again.record == record  # a completed date is not run again


def test_a_rerun_with_another_timeout_and_dask_size_resumes_from_the_days_checkpoint(tmp_path, monkeypatch):
    cfg = _config(tmp_path, **{"trainer.checkpoint_every": 5, "trainer.timeout_s": 600})
    monkeypatch.setenv("CTRPIPE_TRAINER_FAIL_AT", f"0:7:{tmp_path / 'died.marker'}")  # rank 0 dies after step 7
    with pytest.raises(TrainingError, match="exit code"):
        run_day(cfg, DATE)
    failed = read_record(cfg.layout(), DATE)
    assert failed.status == "failed" and "TrainingError" in failed.reason and not failed.completed
    checkpoints = Path(cfg.layout().run_checkpoints(DATE))
    assert [p.name for p in checkpoints.iterdir()] == ["step-000000005"]

    # what an operator does after a timeout: more time, another cluster size; neither changes the model
    rerun = with_overrides(cfg, {"trainer.timeout_s": 7200, "trainer.log_every": 3, "dask.n_workers": 1})
    record = run_day(rerun, DATE).record
    assert record.status == "published"
    meta = read_meta(cfg.layout().run_model(DATE))
    assert meta.train["resumed_from_step"] == 5  # not a fresh start
    assert record.train["run_tag"] == meta.run_tag
    assert not checkpoints.exists()  # the committed model supersedes them

