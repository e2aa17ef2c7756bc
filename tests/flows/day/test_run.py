"""`run_day`: one date, every stage in order, without Prefect; a rerun resumes what a crash left.

The run identity names what changes the trained model (`TrainSpec.identity`), so rerunning a day
that died in training with another timeout or another Dask size resumes from that day's own
checkpoints instead of training again from the start.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from flows.config import with_overrides
from flows.day.record import read_record
from flows.day.run import OVERHEADS, STAGES, DayClock, local_slot, run_day
from flows.presets import demo
from pipeline.generate import generate_days
from storage.io.registry import ModelRegistry
from tests.helpers.faults import crash_once
from trainer.launch.torchrun import TrainingError
from trainer.model_dir import read_meta

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun

DATE = "2026-02-01"


def _config(tmp_path: Path, **overrides):
    generate_days(str(tmp_path / "raw"), 1, 3000, seed=5, start_date=DATE)
    return with_overrides(
        demo(str(tmp_path / "root")),
        {
            "input.url": str(tmp_path / "raw" / "day_{date}.tsv.gz"),
            "dask.processes": False,
            "dask.n_workers": 2,
            "optim.batch_size": 128,
            # the network alone: a companion's fit would be most of the day's training, and these tests are about
            # the stages and a resumed training (the companion's runs: tests/flows/serving/test_companion.py)
            "model.companion": "off",
            **overrides,
        },
    )


SLOT_WAIT_S, PREFECT_START_S = 0.4, 0.3


@contextmanager
def _busy_slot(cfg):
    with local_slot(cfg) as taken:
        time.sleep(SLOT_WAIT_S)  # as if another run of the model had held it for a while
        yield replace(taken, waited_s=SLOT_WAIT_S)


@pytest.fixture(scope="module")
def first_day(tmp_path_factory):
    """One date run by `run_day` as a flow would call it: PREFECT_START_S after the flow's call, with a
    slot that makes it wait SLOT_WAIT_S; and the wall time seen from outside."""
    cfg = _config(tmp_path_factory.mktemp("day"))
    called_at = time.perf_counter() - PREFECT_START_S
    day = run_day(cfg, DATE, slot=_busy_slot, called_at=called_at)
    return cfg, day, time.perf_counter() - called_at


def test_a_day_runs_every_stage_in_order_and_publishes_without_prefect(first_day):
    cfg, day, _ = first_day
    record = day.record
    assert day.ran and record.completed and record.status == "published" and record.model_version == "v00001"
    assert [k for k in record.seconds if k not in OVERHEADS] == [s.name for s in STAGES]  # each once, in order
    assert record == read_record(cfg.layout(), DATE)  # what was written is what was returned
    assert ModelRegistry(cfg.layout()).latest() == "v00001"
    # the optim values were derived for the day's 2,700 train rows; model.json and metrics.json say so
    recipe, meta = record.train["recipe"], read_meta(cfg.layout().run_model(DATE))
    assert meta.recipe == recipe and recipe["rows"] == record.rows_train
    assert recipe["values"]["optim.epochs"] == meta.optim["epochs"] > 1 and "optim.epochs" in recipe["derived"]
    assert recipe["values"]["optim.batch_size"] == 128 and "optim.batch_size" not in recipe["derived"]  # set
    assert record.train["steps"] == recipe["steps"]
    assert record.evaluate["rows_scored"] == record.rows_eval and record.evaluate["rows_per_s"] > 0
    assert record.evaluate["next_day"] is None  # nothing was published before
    again = run_day(cfg, DATE)
    assert not again.ran and again.record == record  # a completed date is not run again


def test_the_stages_and_the_runs_overheads_add_up_to_its_wall_time(first_day):
    _, day, outside = first_day
    seconds, wall = day.record.seconds, day.record.wall_s
    assert set(seconds) == {s.name for s in STAGES} | set(OVERHEADS)
    assert seconds["prefect_start"] == pytest.approx(PREFECT_START_S, abs=0.05)
    assert SLOT_WAIT_S <= seconds["slot_wait"] < SLOT_WAIT_S + 0.5  # timed where the run waits for it
    assert seconds["dask_start"] > 0 and seconds["dask_stop"] > 0 and seconds["history"] > 0
    assert abs(sum(seconds.values()) - wall) < 0.2 + 0.01 * wall  # nothing left out but bookkeeping
    assert wall < outside < wall + 0.5  # all but the writing of the record itself


def test_a_clock_counts_a_part_that_raises_and_the_time_before_it_started():
    clock = DayClock(time.perf_counter() - 1.0)
    with pytest.raises(KeyError), clock.part("stage"):
        time.sleep(0.05)
        raise KeyError("boom")
    assert clock.seconds["prefect_start"] == pytest.approx(1.0, abs=0.05)
    assert 0.05 <= clock.seconds["stage"] < 0.5 and clock.wall() >= 1.05
    assert set(DayClock().seconds) == set()  # no flow called it: nothing before its start


def test_a_rerun_with_another_timeout_and_dask_size_resumes_from_the_days_checkpoint(tmp_path, monkeypatch):
    cfg = _config(tmp_path, **{"trainer.checkpoint_every": 5, "trainer.timeout_s": 600})
    crash_once(monkeypatch, rank=0, step=7, marker=tmp_path / "died.marker")  # rank 0 dies after step 7
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
