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


def _RANK_STORE(host_hits: int) -> dict[str, dict[str, float]]:  # noqa: N802 - reads as a constant's builder
    """One rank's `store.stats()`: 1000 host lookups, 80 evictions, 400 KiB read and 200 KiB written on the SSD."""
    return {
        "host": {"hits": host_hits, "misses": 1000 - host_hits, "evictions": 80, "rows": 50, "policy": "lfu"},
        "ssd": {"bytes_read": 409_600, "bytes_written": 204_800, "read_s": 0.4, "write_s": 0.2, "rows": 500},
    }


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
    attention_kernel="compiled",
    stats={"dense_sync_bytes": 1024, "groups": [[0, 1]], "store_stats": [_RANK_STORE(900), _RANK_STORE(700)]},
)
STORE_CLAUSE = "; store: host hit rate 0.800, SSD 102+51 B read+written/example, waited 17%, 0.02 evictions/example"
"""What the train line says of WRITTEN's stores: 1600 of 2000 host lookups hit, 2 x 400 KiB read for 8000 examples,
2 x 0.6 s in SSD calls over 2 ranks x 3.5 s."""


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
        "(resumed from the checkpoint at step 10)" + STORE_CLAUSE
    )


def test_a_rerun_says_what_it_reused(tmp_path: Path) -> None:
    url = make_model_dir(tmp_path, "m")[0]
    meta = dataclasses.replace(read_meta(str(url)), train=WRITTEN.to_dict())
    reused = TrainResult.committed(str(url), meta)  # nothing trained: the candidate was there
    assert reused.summary().endswith("final loss 0.4100 (the candidate a stopped run committed, reused)" + STORE_CLAUSE)
    fresh = dataclasses.replace(meta, train=dataclasses.replace(WRITTEN, resumed_from_step=0).to_dict())
    assert TrainResult.committed(str(url), fresh, wall_s=3.0).summary().endswith("final loss 0.4100" + STORE_CLAUSE)


def test_the_store_pressure_sums_the_ranks_tiers_and_an_old_record_has_none() -> None:
    p = WRITTEN.store_pressure()
    assert p is not None and p.host_hit_rate == pytest.approx(0.8) and p.device_hit_rate is None
    assert p.ssd_read_bytes_per_example == pytest.approx(102.4) and p.ssd_write_bytes_per_example == pytest.approx(51.2)
    assert p.ssd_wait_s == pytest.approx(1.2) and p.ssd_wait_share == pytest.approx(1.2 / 7)
    assert p.evictions_per_example == pytest.approx(0.02) and (p.host_rows, p.ssd_rows) == (100, 1000)
    assert TrainSummary(examples=10, stats={}).store_pressure() is None  # written before the ranks sent their stores


def test_rows_that_fit_in_the_host_budget_say_so() -> None:
    fits = TrainSummary(examples=10, train_s=1.0, stats={"store_stats": [{"host": {"hits": 9, "misses": 1}}]})
    assert fits.store_pressure().summary() == "store: host hit rate 0.900, no evictions"  # type: ignore[union-attr]


def test_a_device_cache_puts_its_hit_rate_before_the_hosts() -> None:
    tiers = {"device": {"hits": 3, "misses": 1}, "host": {"hits": 1, "misses": 3, "evictions": 2}}
    three = TrainSummary(examples=10, train_s=1.0, stats={"store_stats": [tiers]}).store_pressure()
    assert three is not None and three.summary().startswith(
        "store: device hit rate 0.750, host hit rate 0.250, SSD 0+0 B read+written/example"
    ), three.summary()


def test_the_attention_kernel_is_named_by_the_forwards_each_ran() -> None:
    from trainer.commit import attention_kernel

    assert attention_kernel({"compiled": 40}) == "compiled"
    assert attention_kernel({"plain": 3, "torch-ops": 9, "compiled": 0}) == "torch-ops+plain"  # most forwards first
    assert attention_kernel({}) == "none"  # a model without attention
