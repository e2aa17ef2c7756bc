"""Training-serving parity on the real Criteo sample: the served score of every held-out line is the score
`ctrpipe evaluate` gives the same line, and the served AUC is evaluate's AUC."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest

from flows.day.run import run_day
from tests.helpers.cli_here import ctrpipe_here
from tests.helpers.procs import free_port
from tests.helpers.serving import call, cli_args, day_config, score_server
from trainer.eval.metrics import auc

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun
DATE = "2026-04-01"
HELD_OUT = 1000


def test_served_scores_equal_evaluate_predictions_line_by_line(shared_data, tmp_path, capfd):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_text().splitlines()
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / f"day_{DATE}.tsv").write_text("\n".join(lines) + "\n")
    # the network alone: a companion's fit would be most of the day's training (the served and evaluated scores of
    # a model with one: tests/flows/serving/test_companion.py)
    cfg = day_config(tmp_path / "root", str(tmp_path / "raw" / "day_{date}.tsv"), **{"model.companion": "off"})
    record = run_day(cfg, DATE).record
    assert record.status == "published" and record.rows_eval == HELD_OUT

    held_out = lines[-HELD_OUT:]  # the day's eval split: its last rows in file order
    (tmp_path / "eval.tsv").write_text("\n".join(held_out) + "\n")
    out = ctrpipe_here(
        "evaluate",
        "--model",
        "latest",
        "--input",
        str(tmp_path / "eval.tsv"),
        "--predictions",
        str(tmp_path / "pred.parquet"),
        *cli_args(cfg),
        tmp=tmp_path,
        capfd=capfd,
    )
    assert out.returncode == 0, out.stderr
    evaluated = json.loads(out.stdout.strip().splitlines()[-1])
    pred = pd.read_parquet(tmp_path / "pred.parquet")
    assert len(pred) == HELD_OUT and pred["line"].tolist() == list(range(1, HELD_OUT + 1))

    port = free_port()
    with score_server([*cli_args(cfg), "--model", "latest"], port, tmp_path / "server.log"):
        chunks = [held_out[i : i + 100] for i in range(0, HELD_OUT, 100)]
        with ThreadPoolExecutor(4) as pool:  # concurrent requests: micro-batched together
            answers = list(pool.map(lambda c: call(port, "POST", "/v1/score", {"lines": c}), chunks))
    assert all(status == 200 and body["errors"] == [] for status, body in answers)
    served = np.array([s for _, body in answers for s in body["scores"]])
    assert {body["model_version"] for _, body in answers} == {evaluated["model"]}
    np.testing.assert_allclose(served, pred["score"].to_numpy(), atol=1e-6, rtol=0)
    assert auc(pred["label"].to_numpy(), served) == pytest.approx(evaluated["auc"], abs=1e-6)
