"""Every benchmark test writes its results under its own tmp_path ($BENCH_RESULTS_DIR), never into bench/results."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._common import RESULTS_ENV


@pytest.fixture(autouse=True)
def _results_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "bench-results"))
    return tmp_path / "bench-results"
