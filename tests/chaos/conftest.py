"""The chaos suite (`make chaos`): a seed for every kill moment, one workspace, and the closing table.

CHAOS_SEED replays a run of the suite (the seed is printed in the header and under the table);
CHAOS_TRIALS sets the single-day trials (default 20), CHAOS_VARIANT_TRIALS those of the backfill,
two-rank and S3 variants (default 2); CHAOS_DIR where the roots and logs go (default .chaos/).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.config import load_config
from tests.helpers.chaos import (
    DATE,
    Reference,
    VariantReport,
    Workspace,
    reference,
    table,
    workspace,
)
from tests.helpers.kill import env_for
from tests.helpers.procs import BIN, REPO

SEED = int(os.environ.get("CHAOS_SEED") or secrets.randbelow(1_000_000))
_REPORTS = pytest.StashKey[dict]()


def pytest_report_header(config: pytest.Config) -> str:
    return f"chaos seed {SEED} (replay with CHAOS_SEED={SEED})"


@pytest.fixture(scope="session")
def chaos_seed() -> int:
    return SEED


@pytest.fixture(scope="session")
def reports(request: pytest.FixtureRequest) -> dict[str, VariantReport]:
    """One row of the closing table per variant, filled by the trials."""
    return request.config.stash.setdefault(_REPORTS, {})


WORKDIR = Path(os.environ.get("CHAOS_DIR") or REPO / ".chaos") / f"seed-{SEED}"
"""Every trial's root and logs; kept when a trial fails (removed when the whole suite passed)."""


@pytest.fixture(scope="session")
def workdir() -> Path:
    shutil.rmtree(WORKDIR, ignore_errors=True)  # a replay starts from nothing
    WORKDIR.mkdir(parents=True)
    return WORKDIR


@pytest.fixture(scope="session")
def prefect_home(workdir: Path) -> Path:
    """One PREFECT_HOME for every run of the suite, as on a user's machine (every root, one database).

    Its database is created first, so that no run (the reference's least of all) pays for that.
    """
    home = workdir / "prefect-home"
    subprocess.run(
        [str(BIN / "prefect"), "server", "database", "upgrade", "-y"],
        env={**os.environ, "PREFECT_HOME": str(home)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home


@pytest.fixture(scope="session")
def single_day(shared_data, workdir, prefect_home) -> tuple[Workspace, Reference]:
    """The one-day workspace and its uninterrupted reference run (`ctrpipe run`, a local root)."""
    ws = workspace(workdir, "single-day", shared_data / "criteo" / "train_head_10k.tsv", [DATE], env_for(prefect_home))
    cfg = ws.config("reference")
    ref = reference(
        ["run", "--date", DATE, "--config", str(cfg)],
        ws.env,
        ws.base / "reference.log",
        load_config(cfg).layout(),
        [DATE],
        timeout=600,
    )
    return ws, ref


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if got := config.stash.get(_REPORTS, None):
        terminalreporter.write_sep("=", "chaos")
        terminalreporter.write_line(table(SEED, got))
        terminalreporter.write_line(f"roots and logs: {WORKDIR}" if exitstatus else "all reruns matched")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == 0 and session.config.stash.get(_REPORTS, None):
        shutil.rmtree(WORKDIR, ignore_errors=True)
