"""trainer.plan.parent_eval: a day trains first on the eval rows of the published model's earlier day, and says
why when it cannot (no model, option off, not an earlier day, features gone, no eval rows, other columns)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers.model_dirs import committed_feature_day
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.model_dir import ModelMeta
from trainer.models.config import ModelConfig
from trainer.plan.parent_eval import parent_eval
from trainer.plan.published import Published

TODAY = "2026-01-05"
EVICTED = "/vocab/date=2026-01-05/evicted.parquet"


@pytest.fixture()
def today(tmp_path: Path) -> str:
    return committed_feature_day(tmp_path / "today", train_rows=600, date=TODAY, seed=1)


def _published(features_url: str) -> Published:
    meta = ModelMeta.of(
        model_name="ctr",
        model_config=ModelConfig(),
        dim=16,
        init_std=0.01,
        num_dense=1,
        num_fields=2,
        fields=("k_0", "k_1"),
        dense_columns=("d_0",),
        key_columns=("k_0", "k_1"),
        vocab_date="2026-01-04",
        run_tag="t",
        features_url=features_url,
        init_model_url=None,
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(),
    )
    return Published("v00003", "/models/ctr/v00003", meta)


def _carry(today: str, published: Published | None, *, enabled: bool = True):
    return parent_eval(
        enabled=enabled, date=TODAY, features_url=today, published=published, evicted_url=EVICTED, storage_options=None
    )


def test_the_published_models_eval_rows_are_carried_with_todays_evictions(tmp_path: Path, today: str) -> None:
    parent = committed_feature_day(tmp_path / "parent", train_rows=900, eval_rows=250, date="2026-01-04")
    got = _carry(today, _published(parent))
    c = got.carried
    assert c is not None, got.reason
    assert (c.date, c.rows, c.features_url, c.features_id, c.evicted_url) == (
        "2026-01-04",
        250,
        parent,
        "2026-01-04-0",
        EVICTED,
    )
    assert got.rows == 250 and got.summary() == " + its 250 eval rows"
    assert got.record() == {"date": "2026-01-04", "rows": 250, "reason": "v00003's eval rows, used by its gate"}


@pytest.mark.parametrize("case", ["off", "no model", "same day", "later day", "gone", "no eval rows", "columns"])
def test_nothing_is_carried_and_the_reason_is_named(tmp_path: Path, today: str, case: str) -> None:
    date = {"same day": TODAY, "later day": "2026-01-06"}.get(case, "2026-01-04")
    parent = committed_feature_day(
        tmp_path / "parent", train_rows=900, eval_rows=0 if case == "no eval rows" else 250, date=date
    )
    if case == "gone":
        shutil.rmtree(parent)
    if case == "columns":  # the parent day had another dense column
        manifest = Path(parent, "_SUCCESS.json")
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "dense_columns": ["d_0", "d_1"]}))
    published = None if case == "no model" else _published(parent)
    got = _carry(today, published, enabled=case != "off")
    assert got.carried is None and got.rows == 0
    want = {
        "off": "optim.train_parent_eval is false",
        "no model": "no published model",
        "same day": f"trained on {TODAY}, not before {TODAY}",
        "later day": f"not before {TODAY}",
        "gone": "are gone",
        "no eval rows": "hold no eval rows",
        "columns": "other columns",
    }[case]
    assert want in got.reason, got.reason
    assert got.summary() == f", its eval rows not trained ({got.reason})"
