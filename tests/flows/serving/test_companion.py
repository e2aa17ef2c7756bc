"""A model with a companion (`model.companion: poly2`) on two real Criteo days: the companion is fit on its
lineage's rows, every scorer blends it (evaluation, `ctrpipe evaluate`, the score server, the bundle's dtype
check), and an export that would drop it is refused."""

from __future__ import annotations

import glob
import json

import numpy as np
import pandas as pd
import pytest
import torch

from flows.day.run import run_day
from flows.serving.bundle import COMPANION, BundleReader
from flows.serving.export import ExportError, VersionExport
from flows.serving.model import load_model as load_bundle
from storage.features_manifest import raw_columns
from storage.io.registry import ModelRegistry
from tests.helpers.cli_here import ctrpipe_here
from tests.helpers.procs import free_port
from tests.helpers.serving import call, cli_args, day_config, score_server
from trainer.companion.model import blend
from trainer.eval.scoring import evaluate_model, load_model, score
from trainer.model_dir import read_meta

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun
DATES = ("2026-04-01", "2026-04-02")
ROWS = 2_000  # a day: the first 4,000 rows of the shared head, in order


@pytest.fixture(scope="module")
def two_days(shared_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("companion")
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_text().splitlines()
    (tmp / "raw").mkdir()
    for k, date in enumerate(DATES):
        (tmp / "raw" / f"day_{date}.tsv").write_text("\n".join(lines[k * ROWS : (k + 1) * ROWS]) + "\n")
    cfg = day_config(
        tmp / "root", str(tmp / "raw" / "day_{date}.tsv"), **{"model.companion": "poly2", "encode.raw_keys": True}
    )
    records = [run_day(cfg, d).record for d in DATES]
    assert [r.status for r in records] == ["published", "published"]
    return tmp, cfg, lines, records


def test_the_companion_is_fit_on_the_lineages_rows_and_never_the_days_eval_rows(two_days):
    _, cfg, _, records = two_days
    layout = cfg.layout()
    registry = ModelRegistry(layout)
    first, second = (read_meta(registry.url(v), layout.storage_options) for v in registry.versions())
    assert second.format == "ctr-pipeline-model/4" and second.companion is not None
    assert second.companion["inputs"] == "pairs+counts"
    assert [(s["split"], s["features_url"]) for s in second.companion["sources"]] == [
        ("train", first.features_url),
        ("eval", first.features_url),
        ("train", second.features_url),
    ]
    day1 = first.companion["sources"]
    assert [s["split"] for s in day1] == ["train"]  # the first day: its own train rows alone
    rows = [s["rows"] for s in second.companion["sources"]]
    assert second.companion["rows"] == sum(rows)
    # every row of the day before (its train and its eval rows), and the day's train rows: not its eval rows
    assert rows[0] == day1[0]["rows"] == records[0].rows_train and rows[1] == records[0].rows_eval
    assert rows[2] == records[1].rows_train and sum(rows) == 2 * ROWS - records[1].rows_eval
    assert second.companion["C"] in (0.001, 0.003, 0.01, 0.03, 0.1)
    # the C: the split's on the first day; the second day's rows are twice those, so the split chose again
    assert first.companion["C_chosen"] == {"rows": first.companion["rows"], "fits_ago": 0}
    assert second.companion["rows"] >= 2 * first.companion["rows"]
    assert second.companion["C_chosen"] == {"rows": second.companion["rows"], "fits_ago": 0}
    assert records[1].train["companion"] == second.companion  # the day's record says what was fit


def test_every_score_is_the_mean_of_the_networks_and_the_companions_logits(two_days):
    _, cfg, _, _ = two_days
    layout = cfg.layout()
    url = ModelRegistry(layout).url(ModelRegistry(layout).latest())
    loaded = load_model(url, layout.storage_options, device="cpu")
    assert loaded.companion is not None
    eval_url = f"{loaded.meta.features_url}/eval"
    frame = pd.concat([pd.read_parquet(p) for p in sorted(glob.glob(f"{eval_url}/*.parquet"))], ignore_index=True)
    got = score(loaded, frame)
    s = loaded.schema
    keys = frame[list(s.key_columns)].to_numpy(np.int64)
    own = frame[list(raw_columns(s.key_columns))].to_numpy(np.int64)
    assert (own != keys).any()  # rare values: the OOV key for the network, their own for the companion
    dense = frame[list(s.dense_columns)].to_numpy(np.float32).copy()
    with torch.no_grad():
        emb = loaded.embeddings.lookup(torch.from_numpy(keys.ravel())).reshape(len(frame), len(s.key_columns), -1)
        network = loaded.model(torch.from_numpy(dense), emb).double().numpy()
    want = 1 / (1 + np.exp(-blend(network, loaded.companion.logits(own, dense))))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # the network's float32 sums, batched otherwise
    assert np.abs(got - 1 / (1 + np.exp(-network))).max() > 1e-3  # the companion moves the scores
    assert evaluate_model(loaded, frame)["rows"] == len(frame)
    with pytest.raises(KeyError, match=r"lack columns \['r_0'.*encode.raw_keys=true"):
        score(loaded, frame.drop(columns=list(raw_columns(s.key_columns))))


def test_served_scores_equal_evaluate_predictions_with_the_companion(two_days, capfd):
    tmp, cfg, lines, _ = two_days
    later = lines[2 * ROWS : 2 * ROWS + 300]
    (tmp / "later.tsv").write_text("\n".join(later) + "\n")
    out = ctrpipe_here(
        "evaluate",
        "--model",
        "latest",
        "--input",
        str(tmp / "later.tsv"),
        "--predictions",
        str(tmp / "pred.parquet"),
        *cli_args(cfg),
        tmp=tmp,
        capfd=capfd,
    )
    assert out.returncode == 0, out.stderr
    pred = pd.read_parquet(tmp / "pred.parquet")
    port = free_port()
    with score_server([*cli_args(cfg), "--model", "latest"], port, tmp / "server.log"):
        status, body = call(port, "POST", "/v1/score", {"lines": later})
        one_status, one = call(port, "POST", "/v1/score", {"lines": later[:1]})  # a batch of one line
    assert status == 200 and body["errors"] == [] and one_status == 200
    np.testing.assert_allclose(body["scores"], pred["score"].to_numpy(), atol=1e-6, rtol=0)
    assert one["scores"][0] == pytest.approx(pred["score"].iloc[0], abs=1e-6)


def test_the_bundle_carries_the_companion_and_onnx_is_refused(two_days):
    _, cfg, _, _ = two_days
    layout = cfg.layout()
    version = ModelRegistry(layout).latest()
    bundle = BundleReader(layout.bundle(version), layout.storage_options)
    assert bundle.has(COMPANION)
    assert json.loads(bundle.read("model.json"))["companion"]["kind"] == "poly2"
    assert json.loads(bundle.read("feature_spec.json"))["raw_keys"] is True  # the server encodes the own keys
    served = load_bundle([bundle])
    assert served.companion is not None and served.small_path  # its arrays carry the own keys too
    export = VersionExport(layout, version)
    with pytest.raises(ExportError, match="companion.*ONNX.*without --onnx"):
        export.write_full(str(layout.root) + "/onnx-bundle", onnx=True)
    assert export.dtype_auc("float16")["change"] == pytest.approx(0.0, abs=0.01)
