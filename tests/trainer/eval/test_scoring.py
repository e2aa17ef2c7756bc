"""Loading a model directory written by hand (no torchrun) and scoring with it, bags pooled as in training."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from torch import nn

from storage.embedding.rows.initial import init_rows
from tests.helpers.bags import D, V, bag_model, random_bag_batch, reference_emb
from tests.helpers.model_dirs import DIM, make_model_dir
from trainer.data import FeatureSchema
from trainer.eval.scoring import (
    FrozenEmbeddings,
    LoadedModel,
    evaluate_model,
    load_model,
    score,
    scoring_device,
)


def test_load_model_and_score_match_the_model(tmp_path: Path) -> None:
    url, model, rows = make_model_dir(tmp_path)
    loaded = load_model(str(url))
    assert len(loaded.embeddings) == 4
    keys = torch.tensor([13, 10, 99, 12])
    got = loaded.embeddings.lookup(keys)
    torch.testing.assert_close(got[[0, 1, 3]], torch.stack([rows[13], rows[10], rows[12]]))
    torch.testing.assert_close(got[2], init_rows(torch.tensor([99]), DIM, 0.5)[0])  # unknown key
    df = pd.DataFrame({"label": [1.0, 0.0, 1.0], "d_0": [0.1, 0.5, 2.0], "k_0": [10, 11, 99], "k_1": [12, 13, 10]})
    p = score(loaded, df, batch_size=2)
    emb = loaded.embeddings.lookup(torch.tensor(df[["k_0", "k_1"]].to_numpy()).reshape(-1)).view(3, 2, DIM)
    with torch.no_grad():
        want = torch.sigmoid(model.eval()(torch.tensor(df[["d_0"]].to_numpy(np.float32)), emb)).double().numpy()
    np.testing.assert_allclose(p, want, rtol=1e-6)
    m = evaluate_model(str(url), df)
    assert m["rows"] == 3 and 0 <= m["auc"] <= 1 and m["click_rate"] == pytest.approx(2 / 3)
    with pytest.raises(KeyError, match="k_1"):
        score(loaded, df.drop(columns=["k_1"]))


def test_uncommitted_model_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(FileNotFoundError, match="not a committed model directory"):
        load_model(str(tmp_path / "m"))


def test_frozen_embeddings_empty_table() -> None:
    t = FrozenEmbeddings(np.zeros(0, np.int64), np.zeros((0, 3), np.float32), dim=3, init_std=0.1)
    torch.testing.assert_close(t.lookup(torch.tensor([5, 5])), init_rows(torch.tensor([5, 5]), 3, 0.1))


def test_evaluate_streams_the_parts_of_a_days_eval_split_with_slices(tmp_path: Path) -> None:
    from trainer.eval.metrics import auc as exact_auc

    url, _model, _rows = make_model_dir(tmp_path)
    rng = np.random.default_rng(0)
    day = tmp_path / "features" / "date=2026-01-02"
    frames = []
    for split, n in (("train", 40), ("eval", 20)):
        (day / split).mkdir(parents=True)
        for part in range(2):
            df = pd.DataFrame(
                {
                    "label": rng.integers(0, 2, n).astype(np.float32),
                    "d_0": rng.random(n).astype(np.float32),
                    "k_0": rng.choice([10, 11, 99], n),
                    "k_1": rng.choice([12, 13], n),
                }
            )
            df.to_parquet(day / split / f"part-{part:05d}.parquet", index=False)
            frames.append((split, df))
    held_out = pd.concat([df for split, df in frames if split == "eval"], ignore_index=True)
    got = evaluate_model(str(url), str(day), slices=("k_0",), bins=4)  # a features/date=D dir: its eval split
    assert got["rows"] == 40 and len(got["reliability"]) == 4
    assert got["auc"] == pytest.approx(exact_auc(held_out["label"], score(load_model(str(url)), held_out)), abs=1e-12)
    assert {r["value"] for r in got["slices"]["k_0"]} <= {10, 11, 99}
    assert evaluate_model(str(url), str(day / "train"))["rows"] == 80  # a directory of parts: all of them


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_evaluation_scores_a_bag_model_with_its_bags_pooled_as_in_training(mode: str) -> None:
    keys, lists = random_bag_batch(5, B=9)
    table = torch.randn(V, D)
    model = bag_model(mode).eval()
    schema = FeatureSchema(
        dense_columns=("d_0", "d_1"), key_columns=("k_0", "k_1", "k_2"), fields=("a", "b", "c"), bag_columns=("bag_1",)
    )
    loaded = LoadedModel(
        model=model,
        embeddings=FrozenEmbeddings(np.arange(V), table.numpy(), dim=D, init_std=0.01),
        schema=schema,
        meta=SimpleNamespace(score_eps=1e-7, negative_sampling=1.0),  # what `score` reads of model.json
    )
    dense = torch.rand(9, 2)
    frame = pd.DataFrame(
        {
            "d_0": dense[:, 0].numpy(),
            "d_1": dense[:, 1].numpy(),
            **{f"k_{f}": keys[:, f].numpy() for f in range(3)},
            "bag_1": [np.array(x, np.int64) for x in lists],
        }
    )
    with torch.no_grad():
        want = torch.sigmoid(model(dense, reference_emb(nn.Parameter(table), keys, lists, mode))).double().numpy()
    np.testing.assert_allclose(score(loaded, frame, batch_size=4), want, rtol=1e-6)
    arrow_backed = frame.assign(
        bag_1=pd.Series(pa.array(lists, type=pa.list_(pa.int64())), dtype=pd.ArrowDtype(pa.list_(pa.int64())))
    )
    np.testing.assert_allclose(score(loaded, arrow_backed, batch_size=5), want, rtol=1e-6)
    with pytest.raises(KeyError, match=r"lack columns \['bag_1'\]"):
        score(loaded, frame.drop(columns=["bag_1"]))


def test_evaluation_runs_on_the_training_device_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert scoring_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert scoring_device() == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert scoring_device() == torch.device("cuda")
