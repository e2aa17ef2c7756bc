"""Fixtures of the data-stage tests: one in-process Dask cluster, generated days."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from pipeline.generate import generate_days

DAYS = ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04")
ROWS_PER_DAY = 4000


@pytest.fixture(scope="session")
def client():
    """Two worker threads in this process: real Dask scheduling without process start-up cost."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, Client(
        cluster
    ) as c:
        yield c


@dataclass(frozen=True)
class RawDays:
    path: Path
    dates: tuple[str, ...] = DAYS
    rows: int = ROWS_PER_DAY


@pytest.fixture(scope="session")
def raw_days(tmp_path_factory) -> RawDays:
    """Four generated Criteo days of 4000 rows (read-only: tests copy before changing them)."""
    out = tmp_path_factory.mktemp("raw")
    generate_days(str(out), len(DAYS), ROWS_PER_DAY, seed=3, start_date=DAYS[0])
    return RawDays(out)
