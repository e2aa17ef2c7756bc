"""Train and publish are idempotent: a rerun after a kill ends with one registry version for the date and the
uninterrupted run's result.

Each case rolls the second day of a real two-day run back to what a kill at one point of it leaves
on storage (the stages commit atomically, so these are the only states a kill can leave), reruns
the day, and compares with the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.config import with_overrides
from flows.day.record import read_record
from flows.day.run import run_day
from flows.presets import demo
from pipeline.generate import generate_days
from storage.io.registry import ModelRegistry
from tests.helpers.pristine import Pristine

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun

DAYS = ["2026-06-01", "2026-06-02"]
SAME = (
    "status",
    "auc",
    "logloss",
    "published_auc",
    "rows_ingested",
    "rows_train",
    "rows_eval",
    "vocab_size",
    "published",
    "model_version",
    "latest_version",
    "parent_version",
)


@pytest.fixture(scope="module")
def built_two_days(tmp_path_factory):
    """Two days run to the end once per module, and the second day's record."""
    root = tmp_path_factory.mktemp("idem") / "root"
    generate_days(str(root / "raw"), 2, 3000, seed=3, start_date=DAYS[0])
    # the network alone: a companion's fit would be most of each day's training, and these cases are about what a
    # rerun reuses (the companion's own runs: tests/flows/serving/test_companion.py, tests/flows/prefect/test_daily.py)
    cfg = with_overrides(
        demo(str(root)),
        {
            "input.url": str(root / "raw" / "day_{date}.tsv.gz"),
            "dask.processes": False,
            "dask.n_workers": 1,
            "model.companion": "off",
        },
    )
    for d in DAYS:
        run_day(cfg, d)
    return Pristine(root), (cfg, root, read_record(cfg.layout(), DAYS[1]))


@pytest.fixture()
def two_days(built_two_days):
    """The two days' root as they left it: each case rolls it back to a kill and reruns the day, and a case
    that fails part way must not hand its half-rolled-back root to the next."""
    pristine, days = built_two_days
    pristine.restore()
    return days


def _rerun(cfg, root: Path, expected) -> None:
    registry = ModelRegistry(cfg.layout())
    rerun = run_day(cfg, DAYS[1])
    assert rerun.ran
    assert {k: getattr(rerun.record, k) for k in SAME} == {k: getattr(expected, k) for k in SAME}
    assert registry.versions() == ["v00001", "v00002"] and registry.latest() == "v00002"  # one version for the date
    assert registry.info("v00002").status == "published"
    assert rerun.record.train["wall_s"] == 0.0  # the committed candidate was not trained again
    assert rerun.record.train["run_tag"] == expected.train["run_tag"]


def _forget_the_record(root: Path) -> None:
    (root / "runs" / "ctr" / f"date={DAYS[1]}" / "metrics.json").unlink()


def test_killed_after_latest_moved_the_rerun_starts_from_the_same_parent(two_days):
    cfg, root, expected = two_days
    _forget_the_record(root)  # killed before the day's record: LATEST already names the day's own version
    _rerun(cfg, root, expected)
    assert read_record(cfg.layout(), DAYS[1]).parent_version == "v00001"


def test_killed_after_registering_the_version_the_rerun_reuses_and_publishes_it(two_days):
    cfg, root, expected = two_days
    _forget_the_record(root)
    models = root / "models" / "ctr"
    (models / "LATEST").write_text("v00001\n")
    status = json.loads((models / "v00002" / "status.json").read_text())
    (models / "v00002" / "status.json").write_text(json.dumps({**status, "status": "candidate"}))
    _rerun(cfg, root, expected)


def test_killed_after_training_the_rerun_reuses_the_committed_candidate(two_days):
    cfg, root, expected = two_days
    _forget_the_record(root)
    models = root / "models" / "ctr"
    (models / "LATEST").write_text("v00001\n")
    for p in sorted((models / "v00002").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (models / "v00002").rmdir()
    _rerun(cfg, root, expected)
