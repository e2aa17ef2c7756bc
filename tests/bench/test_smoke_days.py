"""The benchmarks that train days through the flow run at their smoke size (`tests/bench/test_smoke.py` says how and
checks the rest; these are a file of their own so that they can run beside it on another worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.test_smoke import DAYS, params, smoke


@pytest.mark.parametrize("name", params(DAYS))
def test_the_day_benchmark_runs_at_its_smoke_size_and_writes_its_results(
    name: str, tmp_path: Path, request: pytest.FixtureRequest, capfd: pytest.CaptureFixture[str]
) -> None:
    smoke(name, tmp_path, request, capfd)
