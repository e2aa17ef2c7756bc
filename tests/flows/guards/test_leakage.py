"""The leakage check (issue 52): a feature that separates the labels almost perfectly stops the day before training,
naming the column and the reason; real features, ids and sparse fields do not trip it.

The example of docs/schema.md: a mobile-ad conversion log whose attribution timestamp, set only on converted rows,
was declared as a feature.  The run reported AUC 1.0000 logloss 0.0000 and published.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from flows.config import RunConfig
from flows.day import stages
from flows.day.state import DayState
from flows.guards.check_config import CheckAction, ChecksConfig
from flows.guards.data_checks import data_stats, run_checks
from flows.guards.leakage import label_separation
from storage.key_layout import FIELD_SHIFT, MISSING_HASH

ROWS = 20_000
RATE = 0.002  # conversions: 40 in a day's 20,000 rows


def _key(field: int, h: np.ndarray) -> np.ndarray:
    return (np.int64(field) << FIELD_SHIFT) | np.asarray(h, dtype=np.int64)


def _day(seed: int = 0) -> tuple[np.ndarray, dict, dict]:
    """Labels, a real dense column, and key columns: a real app id, a device id (unique), a sparse campaign."""
    rng = np.random.default_rng(seed)
    y = (rng.random(ROWS) < RATE).astype(np.float32)
    y[:20] = 1  # at least 20 positives whatever the draw
    app = rng.integers(2, 300, ROWS)
    app = np.where(y == 1, rng.integers(2, 60, ROWS), app)  # converters favour some apps: a real signal
    dense = {"price (d_0)": np.log1p(rng.gamma(2.0, 5.0, ROWS) * (1 + y))}
    keys = {
        "app (k_0)": _key(0, app),
        "device (k_1)": _key(1, rng.permutation(ROWS) + 2),
        "campaign (k_2)": _key(2, np.where(rng.random(ROWS) < 0.97, MISSING_HASH, rng.integers(2, 9, ROWS))),
    }
    return y, dense, keys


def _check(y, dense, keys, **kw):
    return label_separation(y, dense, keys, max_auc=0.99, max_missing=0.99, **kw)


def test_real_features_ids_and_sparse_fields_pass():
    y, dense, keys = _day()
    violated, value, threshold, detail = _check(y, dense, keys)
    assert not violated and 0.5 < value < 0.9 and threshold == 0.99 and detail.startswith("largest: "), detail


def test_an_attribution_timestamp_set_only_on_conversions_is_named_by_its_value():
    y, dense, keys = _day()
    stamp = np.where(y == 1, np.log1p(1.77e9 + np.arange(ROWS)), 0.0)  # a dense column: missing reads as 0
    violated, value, _, detail = _check(y, {**dense, "attributed_at (d_1)": stamp}, keys)
    assert violated and value == 1.0
    assert detail.startswith("attributed_at (d_1): its value alone predicts the label with AUC 1.0000 on 20,000 rows")
    assert "docs/schema.md#leakage" in detail and "checks.leakage.action=warn" in detail


def test_a_key_present_only_on_conversions_is_named_by_its_presence_and_a_copied_label_by_its_value():
    y, dense, keys = _day()
    conversion_id = _key(3, np.where(y == 1, np.arange(ROWS) + 2, MISSING_HASH))  # unique: its value says nothing
    violated, _, _, detail = _check(y, dense, {**keys, "conversion_id (k_3)": conversion_id})
    assert violated and detail.startswith("conversion_id (k_3): its presence alone predicts the label with AUC 1.0000")
    status = _key(4, 2 + y.astype(np.int64))  # "converted" / "not": present on every row
    violated, _, _, detail = _check(y, dense, {**keys, "status (k_4)": status})
    assert violated and detail.startswith("status (k_4): its value alone predicts the label with AUC 1.0000")


def test_a_key_missing_on_every_negative_and_set_on_most_positives_is_named():
    y, dense, keys = _day()
    rng = np.random.default_rng(1)
    late = np.where((y == 1) & (rng.random(ROWS) < 0.6), rng.integers(2, 5, ROWS), MISSING_HASH)  # 60% attributed
    violated, _, _, detail = _check(y, dense, {**keys, "attribution (k_5)": _key(5, late)})
    assert violated and detail.startswith("attribution (k_5): missing on"), detail
    assert "of positives and 100.0% of negatives" in detail


def test_too_few_rows_of_a_class_are_not_judged():
    y, dense, keys = _day()
    y = np.zeros_like(y)
    y[:5] = 1
    violated, value, _, detail = _check(y, dense, keys)
    assert not violated and value is None and detail == "not judged: 5 positives, 19995 negatives (needs 10 of each)"


def test_the_checks_stage_stops_the_day_naming_the_leaking_column(tmp_path: Path):
    """Criteo's 13 integers and 26 categoricals, the last integer (I13) an attribution time."""
    y, _, _ = _day()
    rng = np.random.default_rng(2)
    frame = {"label": y}
    frame |= {f"d_{i}": np.log1p(rng.gamma(2.0, 5.0, ROWS)).astype(np.float32) for i in range(12)}
    frame["d_12"] = np.where(y == 1, np.log1p(1.77e9), 0.0).astype(np.float32)
    frame |= {f"k_{j}": _key(j, rng.integers(2, 50, ROWS)) for j in range(26)}
    features = tmp_path / "features"
    (features / "train").mkdir(parents=True)
    pd.DataFrame(frame).to_parquet(features / "train" / "part-00000.parquet")
    cfg = RunConfig(root=str(tmp_path / "root"))
    state = DayState(date="2026-03-01", layout=cfg.layout()).with_result("encode", SimpleNamespace(url=str(features)))
    found = stages.leakage(cfg, state)
    stats = data_stats(
        rows_read=ROWS,
        rows_quarantined=0,
        rows_padded=0,
        ingest_stats={"rows": ROWS, "clicks": int(y.sum()), "missing": {}, "dense_hist": {}},
        day_fields=[],
        duplicate_share=0.0,
    )
    report = run_checks(stats, [], cfg.checks, leakage=found)
    assert [c.name for c in report.failed] == ["leakage"]
    assert report.reason().startswith("data checks failed: leakage: I13 (d_12): its value alone predicts the label")
    off = replace(cfg, checks=ChecksConfig(leakage=CheckAction(action="off")))
    assert stages.leakage(off, state) is None


@pytest.mark.parametrize("key", ["max_feature_auc", "max_one_class_missing"])
def test_bad_leakage_thresholds_name_the_key(key):
    with pytest.raises(ValueError, match=f"checks.{key}"):
        ChecksConfig(**{key: 0.4})
