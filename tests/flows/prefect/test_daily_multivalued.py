"""End to end: a log with a multi-valued field, described by a YAML schema file, through the daily flow.

The click depends only on whether the tag `hot` is in a row's list of tags, and `hot` is never the
first tag.  The first tag is all a model sees of the field without bags (`k_j`), so a model that
ignores the bags (`model.bag_pooling: none`) cannot beat chance, while one that pools them
(`mean`, trained by 2 torchrun ranks) finds the signal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from flows.config import with_overrides
from flows.day.record import read_record
from flows.prefect.daily import daily_retrain
from flows.presets import demo
from pipeline.encode.keys import feature_keys
from storage.io.layout import Layout

# days run: a Dask scheduler, Prefect (the session's server), torchrun
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_in_process")]

DATE = "2026-02-01"
ROWS = 5000

TAGS_SCHEMA = """
name: tagged
separator: ";"
header: true
columns: [clicked, price, site, tags]
label: {column: clicked, positive: ["1"], negative: ["0"]}
integer: [price]
categorical: [site]
multi_valued: {tags: "|"}
"""


def tagged_log(n: int, seed: int = 0) -> str:
    """Each row: three tags, the first a noise tag; half the rows carry `hot` second or third.

    P(click) = 0.9 with `hot`, 0.1 without; site and price are noise.
    """
    rng = np.random.default_rng(seed)
    lines = ["clicked;price;site;tags"]
    for _ in range(n):
        hot = rng.random() < 0.5
        rest = ["hot" if hot else f"n{rng.integers(20)}", f"n{rng.integers(20)}"]
        rng.shuffle(rest)
        tags = [f"n{rng.integers(20)}", *rest]
        click = int(rng.random() < (0.9 if hot else 0.1))
        lines.append(f"{click};{rng.integers(100)};s{rng.integers(4)};{'|'.join(tags)}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def tagged_input(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("bags")
    (base / "tagged.yaml").write_text(TAGS_SCHEMA)
    (base / "raw").mkdir()
    (base / "raw" / f"day_{DATE}.csv").write_text(tagged_log(ROWS))
    return base, base / "tagged.yaml"


def _run(base: Path, schema: Path, name: str, **overrides) -> tuple[dict, Layout]:
    root = base / name
    cfg = with_overrides(
        demo(str(root)),
        {
            "input.url": str(base / "raw" / "day_{date}.csv"),
            "input.format": str(schema),
            "dask.processes": False,
            "dask.n_workers": 2,
            "encode.eval_fraction": 0.2,
            "optim.batch_size": 64,
            "optim.epochs": 4,
            "optim.k_steps": 1,
            # the network alone: the bags are its input, and a companion's fit would be most of each run's training
            "model.companion": "off",
            **overrides,
        },
    )
    daily_retrain(DATE, config=cfg.to_dict())
    return read_record(cfg.layout(), DATE), cfg.layout()


def test_pooled_bags_find_a_signal_the_first_tag_does_not_carry(tagged_input) -> None:
    base, schema = tagged_input
    pooled, layout = _run(base, schema, "mean", **{"trainer.nproc_per_node": 2})
    assert pooled.status == "published", pooled
    model = json.loads((Path(layout.run_model(DATE)) / "model.json").read_text())
    assert model["bag_columns"] == ["bag_1"] and model["model_config"]["bag_pooling"] == "mean"
    assert model["train"]["world_size"] == 2
    hot = int(feature_keys(1, ["hot"])[0])  # tags are field 1 (after site)
    feats = pd.read_parquet(Path(layout.features(DATE)) / "train")
    assert hot not in set(feats["k_1"]) and any(hot in bag for bag in feats["bag_1"])  # never first, in bags
    working_set = pd.read_parquet(Path(layout.features(DATE)) / "key_counts.parquet")
    assert hot in set(working_set["key"])  # warm loads the bag keys too
    sparse = pd.concat(pd.read_parquet(p) for p in (Path(layout.run_model(DATE)) / "sparse").glob("*.parquet"))
    assert hot in set(sparse["key"])  # the trainer pushed its row

    # chance AUC by design: below the publish floor, which is not what this compares
    first_only, layout_none = _run(base, schema, "none", **{"model.bag_pooling": "none", "publish.min_auc": 0.0})
    model_none = json.loads((Path(layout_none.run_model(DATE)) / "model.json").read_text())
    assert model_none["bag_columns"] == []
    # ~1000 eval rows: chance AUC has a std of ~0.02; the signal's best AUC is 0.9
    assert first_only.auc < 0.6, first_only
    assert pooled.auc > 0.8, pooled
