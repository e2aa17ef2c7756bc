"""Shared fixtures.

Every test run gets its own temp root (TMPDIR, PREFECT_HOME) so Dask,
torchelastic and Prefect leave nothing in shared temp dirs or in `~`.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

_RUN_TMP = Path(tempfile.mkdtemp(prefix="ctrpipe-tests-"))
os.environ["TMPDIR"] = str(_RUN_TMP)
tempfile.tempdir = str(_RUN_TMP)
os.environ.setdefault("PREFECT_HOME", str(_RUN_TMP / "prefect-home"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "90"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", str(_RUN_TMP / "dask"))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The chaos suite (tests/chaos, `make chaos`, long) runs only when a `-m` expression names it."""
    if "chaos" in (config.getoption("markexpr") or ""):
        return
    chaos = [item for item in items if item.get_closest_marker("chaos")]
    if chaos:
        config.hook.pytest_deselected(items=chaos)
        items[:] = [item for item in items if not item.get_closest_marker("chaos")]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_RUN_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real Criteo/Avazu samples in ../shared/data (never copied into the repo).

    Skips, saying why, in a fresh clone without the shared folder; CI always has it.
    """
    if not (SHARED_DATA / "criteo" / "train_head_10k.tsv").exists():
        pytest.skip(f"real ad-log samples not found at {SHARED_DATA} (place the shared/ folder beside the repo)")
    return SHARED_DATA


@pytest.fixture()
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
