"""Features directories on disk for the companion's tests: a split of numbered rows, with or without the
values' own keys."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from storage.features_manifest import FeaturesManifest
from storage.io.fsio import SUCCESS
from storage.key_layout import FIELD_SHIFT
from trainer.companion.poly2 import Poly2Config
from trainer.data import FeatureSchema

SCHEMA = FeatureSchema(dense_columns=("d_0",), key_columns=("k_0", "k_1"), fields=("C1", "C2"))
FAST = Poly2Config(bits=14, cs=(0.1, 1.0))


def write_split(root, name: str, split: str, first: int, n: int, seed: int = 0, *, raw_keys: bool = True) -> str:
    """A features directory `root/name` whose `split` holds rows numbered first..first+n-1 (d_0 is the number);
    every value is OOV in k_j, its own key in r_j (with `raw_keys`).  Its first split commits it with a manifest
    dated `first` days after 2026-01-01: rows numbered later are of later dates, as a lineage's are."""
    rng = np.random.default_rng(seed + first)
    a, b = rng.integers(0, 3, n), rng.integers(0, 3, n)
    frame = pd.DataFrame(
        {
            "label": (rng.random(n) < np.where(a == b, 0.7, 0.2)).astype(np.float32),
            "d_0": np.arange(first, first + n, dtype=np.float32),
            "k_0": np.zeros(n, np.int64),
            "k_1": np.full(n, 1 << FIELD_SHIFT, np.int64),
        }
    )
    if raw_keys:
        frame["r_0"], frame["r_1"] = (a + 2).astype(np.int64), ((1 << FIELD_SHIFT) | (b + 2)).astype(np.int64)
    (root / name / split).mkdir(parents=True, exist_ok=True)
    if not (root / name / SUCCESS).exists():
        date = str(np.datetime64("2026-01-01") + first)
        (root / name / SUCCESS).write_text(json.dumps(FeaturesManifest(date=date).to_dict()))
    for i, part in enumerate(np.array_split(np.arange(n), 2)):  # two parts: read in name order
        frame.iloc[part].to_parquet(root / name / split / f"part-{i:05d}.parquet")
    return str(root / name)
