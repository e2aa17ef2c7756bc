"""`ctrpipe backfill` over three days, SIGKILLed at a random moment: the rerun resumes and ends with the
reference chain of versions (each day warm-started from the one before)."""

from __future__ import annotations

import pytest

from flows.config import load_config
from storage.io.dates import date_range
from tests.helpers.chaos import (
    VARIANT_TRIALS,
    kill_and_rerun,
    kill_time,
    reference,
    workspace,
)
from tests.helpers.kill import env_for

pytestmark = pytest.mark.chaos

DAYS = date_range("2026-05-01", "2026-05-03")
ARGS = ["backfill", "--start", DAYS[0], "--end", DAYS[-1]]


@pytest.fixture(scope="module")
def backfill(shared_data, workdir, prefect_home):
    ws = workspace(workdir, "backfill", shared_data / "criteo" / "train_head_10k.tsv", DAYS, env_for(prefect_home))
    cfg = ws.config("reference")
    ref = reference(
        [*ARGS, "--config", str(cfg)], ws.env, ws.base / "reference.log", load_config(cfg).layout(), DAYS, timeout=900
    )
    assert [v for v, _, _ in ref.chain] == ["v00001", "v00002", "v00003"]
    return ws, ref


@pytest.mark.parametrize("trial", range(VARIANT_TRIALS))
def test_a_backfill_killed_at_random_resumes_to_the_reference_chain(trial, backfill, chaos_seed, reports):
    ws, ref = backfill
    kill_at = kill_time(chaos_seed, "backfill", trial, 0.0, ref.run.seconds)
    cfg = ws.config(f"trial-{trial}")
    problems = kill_and_rerun(
        ws,
        "3-day backfill",
        trial,
        [*ARGS, "--config", str(cfg)],
        load_config(cfg).layout(),
        DAYS,
        ref,
        kill_at=kill_at,
        seed=chaos_seed,
        reports=reports,
    )
    assert not problems, f"killed at {kill_at}s; logs in {ws.base}"
