"""`ctrpipe run` for one day, SIGKILLed with its process group at a random moment, then run again.

Each trial kills at a moment drawn over the uninterrupted run's duration (seeded: `chaos_seed`)
and reruns the same command; the rerun must end with the reference run's result (see
`tests.helpers.chaos.rerun_problems`) without waiting for the dead run.
"""

from __future__ import annotations

import os

import pytest

from flows.config import load_config
from tests.helpers.chaos import DATE, kill_and_rerun, kill_time

pytestmark = pytest.mark.chaos

TRIALS = int(os.environ.get("CHAOS_TRIALS", "20"))


@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_run_killed_at_random_reruns_to_the_uninterrupted_result(trial, single_day, chaos_seed, reports):
    ws, ref = single_day
    kill_at = kill_time(chaos_seed, "single-day", trial, 0.0, ref.run.seconds)
    cfg = ws.config(f"trial-{trial}")
    problems = kill_and_rerun(
        ws,
        "single day",
        trial,
        ["run", "--date", DATE, "--config", str(cfg)],
        load_config(cfg).layout(),
        [DATE],
        ref,
        kill_at=kill_at,
        seed=chaos_seed,
        reports=reports,
    )
    assert not problems, f"killed at {kill_at}s; logs in {ws.base}"
