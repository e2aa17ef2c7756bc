"""The companion's two side benchmarks (`bench._companion_solver`, `bench._companion_folds`) run at their smoke
size and report each solver and each cv: they are not commands of `python -m bench --smoke`, so without this test
they would break silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import _companion_folds, _companion_solver
from bench._common import RESULTS_ENV

pytestmark = pytest.mark.slow  # real rows, a few fits each


def test_the_solver_bench_times_both_solvers_at_the_same_c_and_says_the_loss_each_reached(
    shared_data, tmp_path: Path, monkeypatch
) -> None:
    pytest.importorskip("sklearn", reason="the solver bench times scikit-learn's liblinear: pip install '.[test]'")
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    assert _companion_solver.main(["--smoke"]) == 0
    rows = json.loads((tmp_path / "companion_solver.json").read_text())["rows"]
    assert any(r["run"].startswith("scikit-learn liblinear") for r in rows)
    assert any(r["run"].startswith("ours (kept)") for r in rows) and len({r["C"] for r in rows}) == 1
    assert all(r["s"] > 0 and r["loss_excess_ppm"] >= -1e-3 for r in rows)  # none below the minimum


def test_the_folds_bench_compares_forward_folds_with_blocks_on_the_same_rows(shared_data, tmp_path, monkeypatch):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path))
    assert _companion_folds.main(["--smoke"]) == 0
    rows = {r["cv"]: r for r in json.loads((tmp_path / "companion_folds.json").read_text())["rows"]}
    assert set(rows) == {"blocks", "forward"} and "vs_sd" in rows["forward"]
    assert len(rows["blocks"]["C_per_origin"]) == len(rows["forward"]["C_per_origin"]) == 2
