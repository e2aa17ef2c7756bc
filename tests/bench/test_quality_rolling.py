"""bench.quality --protocol rolling: every shared real row cut into days by row order, each origin trained
through the product path on the days before it and scored on the next; pooled AUCs with paired sds and the
peers (or a line saying why a peer is skipped)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.quality_rolling import SMOKE, split_counts

REPO = Path(__file__).resolve().parents[2]


def test_a_sample_is_cut_into_consecutive_days_of_almost_equal_size() -> None:
    assert split_counts(10_000, 5) == (2_000,) * 5
    assert split_counts(9_999, 5) == (1_999, 2_000, 2_000, 2_000, 2_000)
    assert sum(split_counts(3_301, 3)) == 3_301
    with pytest.raises(ValueError, match="rolling split"):
        split_counts(10, 1)


@pytest.mark.slow
def test_the_smoke_run_pools_every_origin_and_compares_every_model_on_the_same_rows(shared_data, tmp_path) -> None:
    out = tmp_path / "rolling"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CTR_SHARED_DATA": str(shared_data), "TMPDIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-m", "bench.quality", "--protocol", "rolling", "--smoke", "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    criteo = result["datasets"]["criteo"]
    split = criteo["split"]
    assert split["rows_per_day"] == [1_100] * SMOKE.days and split["origins"] == [1, 2]
    assert split["pooled_rows"] == 2_200  # days 2 and 3: every row after the first day is scored once
    rows = {r["model"]: r for r in criteo["rows"]}
    for peer in ("sklearn-lr", "deepctr-deepfm"):  # run, or skipped with the reason printed
        assert peer in rows or (peer in criteo["skipped"] and f"{peer} skipped" in run.stdout)
    assert {"attention", "lr"} <= set(rows)
    for model, r in rows.items():
        assert 0.55 < r["auc"] < 0.9 and len(r["auc_per_origin"]) == 2
        if model != "attention":
            assert 0 < r["vs_sd"] < 0.05 and r["vs_default"] == pytest.approx(r["auc"] - rows["attention"]["auc"])
    days = criteo["days"]["attention"][0]
    assert days[0]["status"] == "published" and days[1]["rows_carried"] > 0  # day 2 trains day 1's eval rows
