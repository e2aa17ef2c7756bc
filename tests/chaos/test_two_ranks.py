"""`ctrpipe run` with two trainer ranks (`trainer.nproc_per_node=2`), SIGKILLed at a random moment of its
training (the all-to-all of the sparse rows, the k-step merge of the dense weights), then run again."""

from __future__ import annotations

import pytest

from flows.config import load_config
from tests.helpers.chaos import (
    DATE,
    VARIANT_TRIALS,
    kill_and_rerun,
    kill_time,
    reference,
)
from tests.helpers.kill import window

pytestmark = pytest.mark.chaos

TWO_RANKS = {"trainer": {"nproc_per_node": 2}}


@pytest.fixture(scope="module")
def two_ranks(single_day):
    ws, _ = single_day
    cfg = ws.config("two-ranks-reference", **TWO_RANKS)
    ref = reference(
        ["run", "--date", DATE, "--config", str(cfg)],
        ws.env,
        ws.base / "two-ranks-reference.log",
        load_config(cfg).layout(),
        [DATE],
        timeout=600,
    )
    assert ref.days[DATE].status == "published"
    start, end = window(ref.run, "warm:", "train:")  # from the end of warm to the end of train
    return ws, ref, end - start


@pytest.mark.parametrize("trial", range(VARIANT_TRIALS))
def test_a_two_rank_run_killed_while_training_reruns_to_the_uninterrupted_result(trial, two_ranks, chaos_seed, reports):
    ws, ref, train_s = two_ranks
    kill_at = kill_time(chaos_seed, "two-ranks", trial, 0.0, train_s)
    cfg = ws.config(f"two-ranks-{trial}", **TWO_RANKS)
    problems = kill_and_rerun(
        ws,
        "two ranks (in train)",
        trial,
        ["run", "--date", DATE, "--config", str(cfg)],
        load_config(cfg).layout(),
        [DATE],
        ref,
        kill_at=kill_at,
        seed=chaos_seed,
        reports=reports,
        after="warm:",
    )
    assert not problems, f"killed at {kill_at}s; logs in {ws.base}"
