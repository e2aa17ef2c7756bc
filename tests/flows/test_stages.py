"""flows.stages.train_spec: the day's optim values are derived from its train rows, and the run identity
hashes the values trained with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from flows.config import RunConfig, with_overrides
from flows.stages import WarmResult, train_spec
from flows.state import DayState
from pipeline.encode import EncodeResult
from storage.warm import WarmPlan
from trainer.world import resolve_world

DATE = "2026-01-05"


def _state(cfg: RunConfig, rows_train: int) -> DayState:
    plan = WarmPlan(date=DATE, world_size=resolve_world(cfg.trainer).world_size, published_version=None, snapshot_url=None,
                    snapshot_tag=None, evict_url=None, working_set_url=None)
    encoded = EncodeResult(date=DATE, rows_train=rows_train, rows_eval=400, skipped=False, run_id="r1", url="/f")
    return DayState(date=DATE, layout=cfg.layout(), encode=encoded, warm=WarmResult(plan, "flow", "cold"))


def test_the_spec_holds_the_values_derived_for_the_days_rows(tmp_path: Path) -> None:
    cfg = RunConfig(root=str(tmp_path))
    spec, recipe = train_spec(cfg, _state(cfg, 3_600))
    assert spec.optim.unresolved() == [] and spec.model.unresolved() == []
    assert spec.optim == recipe.optim and spec.model == recipe.model and spec.recipe == recipe.record()
    assert spec.optim.epochs > 1 and spec.model.dropout > 0  # a small day takes several regularised passes
    big, _ = train_spec(cfg, _state(cfg, 10**8))
    assert (big.optim.epochs, big.optim.batch_size, big.model.dropout) == (1, 1024, 0.0)


def test_the_run_identity_hashes_the_resolved_values_not_auto(tmp_path: Path) -> None:
    cfg = RunConfig(root=str(tmp_path))
    derived, recipe = train_spec(cfg, _state(cfg, 3_600))
    values = {k: v for k, v in recipe.record()["values"].items()}
    explicit = with_overrides(cfg, values)  # the same numbers, set by hand
    same, again = train_spec(explicit, _state(explicit, 3_600))
    assert again.derived == () and same.identity() == derived.identity() and same.run_tag == derived.run_tag
    other, _ = train_spec(cfg, _state(cfg, 36_000))  # another day size: other values, another identity
    assert other.identity() != derived.identity()
    assert dataclasses.replace(derived, recipe={}).identity() == derived.identity()  # the reasons are not hashed
