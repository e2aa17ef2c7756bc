"""Fixtures of the data-stage tests: one in-process Dask cluster, generated days."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from pipeline.generate import generate_days
from tests.helpers.raw_days import DAYS, ROWS_PER_DAY, RawDays


@pytest.fixture(scope="session")
def client():
    """Two worker threads in this process: real Dask scheduling without process start-up cost (no dashboard)."""
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="session")
def raw_days(tmp_path_factory) -> RawDays:
    """Four generated Criteo days of 4000 rows (read-only: tests copy before changing them)."""
    out = tmp_path_factory.mktemp("raw")
    generate_days(str(out), len(DAYS), ROWS_PER_DAY, seed=3, start_date=DAYS[0])
    return RawDays(out)


@pytest.fixture()
def raw_root(tmp_path, raw_days) -> Path:
    """A fresh root whose raw/ is a copy of `raw_days` (the ingest default input; tests may damage it)."""
    shutil.copytree(raw_days.path, tmp_path / "raw")
    return tmp_path
