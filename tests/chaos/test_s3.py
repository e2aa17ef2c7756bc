"""`ctrpipe run` on an `s3://` root (a real moto S3 server on 127.0.0.1), SIGKILLed at a random moment:
the rerun ends with the uninterrupted run's result and no data prefix or staging object is left behind."""

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
from tests.helpers.procs import AWS_ENV, moto_s3

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def s3(single_day):
    ws, _ = single_day
    ws = type(ws)(ws.base / "s3", ws.raw, {**ws.env, **AWS_ENV})
    ws.base.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in AWS_ENV.items():  # for reading the root back here
            mp.setenv(k, v)
        yield from _trials_on(ws)


def _trials_on(ws):
    with moto_s3(ws.base) as options:

        def config(name: str):
            return ws.config(
                name,
                root=f"s3://ctr/{name}",
                storage_options=options,
                store={"local_dir": str(ws.base / name / "local")},
            )

        cfg = config("reference")
        ref = reference(
            ["run", "--date", DATE, "--config", str(cfg)],
            ws.env,
            ws.base / "reference.log",
            load_config(cfg).layout(),
            [DATE],
            timeout=600,
        )
        yield ws, ref, config


@pytest.mark.parametrize("trial", range(VARIANT_TRIALS))
def test_a_run_on_s3_killed_at_random_reruns_to_the_uninterrupted_result(trial, s3, chaos_seed, reports):
    ws, ref, config = s3
    kill_at = kill_time(chaos_seed, "s3", trial, 0.0, ref.run.seconds)
    cfg = config(f"trial-{trial}")
    problems = kill_and_rerun(
        ws,
        "s3:// root (moto)",
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
