"""trainer.launch.summary.TrainSummary: what rank 0 writes into model.json `train` is what the launcher reads back,
model.json files of older ranks still read, and `TrainResult` is built from it in one place."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from tests.helpers.formats import sample
from tests.helpers.model_dirs import make_model_dir
from trainer.launch.summary import _KINDS, TrainSummary
from trainer.launch.torchrun import TrainResult
from trainer.model_dir import read_meta

WRITTEN = TrainSummary(
    steps=32,
    epochs=2,
    examples=8000,
    dropped_rows=1,
    carried={"date": "2026-01-04", "rows": 400},
    final_loss=0.41,
    mean_loss=0.52,
    train_s=3.5,
    examples_per_s=2285.7,
    world_size=2,
    backend="gloo",
    device="cpu",
    resumed_from_step=10,
    prefetch_depth=2,
    stats={"dense_sync_bytes": 1024, "groups": [[0, 1]], "store_stats": [{"hits": 3}, {"hits": 4}]},
)


def test_what_the_rank_writes_reads_back_through_json() -> None:
    data = json.loads(json.dumps(WRITTEN.to_dict()))
    assert data["steps"] == 32 and data["groups"] == [[0, 1]] and "stats" not in data  # flat, as model.json holds it
    assert TrainSummary.from_dict(data) == WRITTEN


def test_the_train_section_of_a_model_json_of_today_reads_and_writes_back_the_same() -> None:
    written = sample("model-v2.json")["train"]  # as rank 0 wrote it before TrainSummary
    summary = TrainSummary.from_dict(written)
    assert summary.steps == written["steps"] and summary.world_size == written["world_size"]
    assert summary.backend == written["backend"] and summary.stats["groups"] == written["groups"]
    assert json.loads(json.dumps(summary.to_dict())) == written


def test_every_typed_field_has_its_json_kind() -> None:
    assert set(_KINDS) == {f.name for f in dataclasses.fields(TrainSummary)} - {"stats"}


def test_an_older_train_section_reads_with_defaults_and_keeps_unknown_keys() -> None:
    old = TrainSummary.from_dict({"steps": 5, "examples": 640, "world_size": 1, "some_counter_of_then": 7})
    assert (old.steps, old.examples, old.world_size, old.resumed_from_step, old.backend) == (5, 640, 1, 0, None)
    assert math.isnan(old.final_loss) and old.stats == {"some_counter_of_then": 7}
    empty = TrainSummary.from_dict(None)
    assert empty.steps == 0 and empty.examples_per_s == 0.0 and empty.stats == {}


def test_a_typed_field_of_the_wrong_kind_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"train\.steps must be int, got 'many'"):
        TrainSummary.from_dict({"steps": "many"})


def test_stats_may_not_shadow_a_typed_field() -> None:
    with pytest.raises(ValueError, match="repeats the typed fields"):
        TrainSummary(steps=1, stats={"steps": 2})


def test_train_result_is_built_from_the_committed_model_json(tmp_path: Path) -> None:
    url = make_model_dir(tmp_path, "m")[0]
    meta = dataclasses.replace(read_meta(str(url)), train=WRITTEN.to_dict())
    result = TrainResult.committed(str(url), meta, wall_s=4.0)
    assert result.train == WRITTEN and result.wall_s == 4.0 and result.model_url == str(url)
    assert result.summary() == (
        "train: 32 steps on 2 rank(s), 8000 examples, 2,286 examples/s, final loss 0.4100 "
        "(resumed from the checkpoint at step 10)"
    )


def test_a_rerun_says_what_it_reused(tmp_path: Path) -> None:
    url = make_model_dir(tmp_path, "m")[0]
    meta = dataclasses.replace(read_meta(str(url)), train=WRITTEN.to_dict())
    reused = TrainResult.committed(str(url), meta)  # nothing trained: the candidate was there
    assert reused.summary().endswith("final loss 0.4100 (the candidate a stopped run committed, reused)")
    fresh = dataclasses.replace(meta, train=dataclasses.replace(WRITTEN, resumed_from_step=0).to_dict())
    assert TrainResult.committed(str(url), fresh, wall_s=3.0).summary().endswith("final loss 0.4100")
