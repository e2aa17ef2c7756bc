"""Two runs never train or publish the same model at once (a free slot is exercised by every other flow test)."""

from __future__ import annotations

import pytest

from flows.config import with_overrides
from flows.daily import daily_retrain
from flows.locks import model_slot
from flows.recipes import demo
from flows.record import read_record
from pipeline.generate import generate_days

pytestmark = pytest.mark.slow


def test_a_second_run_waits_then_fails_clearly_and_changes_nothing(tmp_path):
    generate_days(str(tmp_path / "raw"), 1, 2000, seed=1, start_date="2026-05-01")
    cfg = with_overrides(demo(str(tmp_path / "root")), {
        "input.url": str(tmp_path / "raw" / "day_{date}.tsv.gz"),
        "dask.processes": False,
        "publish.lock_timeout_s": 3,
    })
    with model_slot(cfg.model_name, timeout_s=30):  # another run holds the model
        state = daily_retrain("2026-05-01", config=cfg.to_dict(), return_state=True)
    assert state.is_failed()
    record = read_record(cfg.layout(), "2026-05-01")
    assert record.status == "failed" and "ModelBusyError" in record.reason
    assert "ctr-train-publish-ctr" in record.reason
    assert not (tmp_path / "root" / "models").exists()  # nothing trained or published
