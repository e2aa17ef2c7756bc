"""The leakage check: a feature that separates the labels almost perfectly on the day's rows.

A column known only after the click (an attribution time set on converted rows alone, a conversion id) or
copied from the label predicts it better than any click model can: the model learns it, scores AUC 1.0 on the
eval rows, publishes, and is useless online where the column is never set.  So before training, on a seeded
sample of the day's train rows (`SAMPLE_ROWS`), each feature column is tried alone:

    value     its AUC as a score of the label, in either direction: a dense column's value; a key column's
              value by the click rate of that value on the other half of the rows (out of fold: a value seen
              once, an id, predicts nothing)
    presence  a key column present (not its field's missing key) on the rows of one class and not the other:
              AUC = 0.5 + |a - b| / 2, a and b the shares of positives and of negatives where it is present
    missing   missing on at least checks.max_one_class_missing of one class's rows and on at most half of
              the other's (present on too few positives to reach the AUC: conversions attributed late)

A column at checks.max_feature_auc or above, or missing so, fails the check (`checks.leakage`), naming the
column and the reason.  A dense column's missing values are 0 in the features, so its presence is its value.
With fewer than `MIN_CLASS_ROWS` rows of either class the check is not judged, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from storage.key_layout import HASH_MASK, MISSING_HASH
from trainer.eval.metrics import auc

SAMPLE_ROWS = 50_000
"""Rows of the day's train split the check reads (all of a smaller day's)."""
MIN_CLASS_ROWS = 10
"""Rows of each class the check needs to judge."""

Found = tuple[bool, float | None, float, str]
"""What a check of `flows.guards.data_checks` finds: (violated, value, threshold, detail)."""


def label_separation(
    labels: np.ndarray,
    dense: Mapping[str, np.ndarray],
    keys: Mapping[str, np.ndarray],
    *,
    max_auc: float,
    max_missing: float,
) -> Found:
    """The leakage check on rows: `labels` (0/1), `dense` and `keys` (name -> the column's values, `keys` the
    int64 feature keys); the value is the largest single-column AUC, the detail names the worst column."""
    y = np.asarray(labels, dtype=np.float64)
    pos, neg = int(y.sum()), int(y.size - y.sum())
    if min(pos, neg) < MIN_CLASS_ROWS:
        return False, None, max_auc, f"not judged: {pos} positives, {neg} negatives (needs {MIN_CLASS_ROWS} of each)"
    found: dict[str, tuple[float, str]] = {}  # column -> (AUC, how)
    missing: dict[str, tuple[float, float]] = {}  # column -> (share missing of positives, of negatives)
    for name, x in dense.items():
        found[name] = (_either_way(auc(y, np.asarray(x, dtype=np.float64))), "its value")
    for name, k in keys.items():
        k = np.asarray(k, dtype=np.int64)
        present = (k & HASH_MASK) != MISSING_HASH
        a, b = present[y == 1].mean(), present[y == 0].mean()
        presence = (0.5 + abs(a - b) / 2, "its presence")  # the simpler reason, when both say as much
        found[name] = max(presence, (_either_way(auc(y, _out_of_fold_rates(k, y))), "its value"), key=lambda f: f[0])
        missing[name] = (1 - a, 1 - b)
    rows = f"on {y.size:,} rows ({pos} positives)"
    worst = max(found, key=lambda c: found[c][0])
    value, how = found[worst]
    if value >= max_auc:
        return True, value, max_auc, f"{worst}: {how} alone predicts the label with AUC {value:.4f} {rows}" + _FIX
    one_class = [c for c, (mp, mn) in missing.items() if max(mp, mn) >= max_missing and min(mp, mn) <= 0.5]
    if one_class:
        c, (mp, mn) = one_class[0], missing[one_class[0]]
        return True, value, max_auc, f"{c}: missing on {mp:.1%} of positives and {mn:.1%} of negatives {rows}" + _FIX
    return False, value, max_auc, f"largest: {worst}, {how} AUC {value:.4f} {rows} (limit {max_auc})"


_FIX = (
    ": a column known only after the click leaks the label (docs/schema.md#leakage); drop it from the schema, "
    "or rerun with --set checks.leakage.action=warn if it is known at serving time"
)


def _either_way(a: float) -> float:
    return max(a, 1.0 - a)


def _out_of_fold_rates(keys: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's key scored by that key's click rate on the other half of the rows (alternate rows); a key the
    other half lacks, by that half's click rate."""
    half = np.arange(keys.size) % 2
    out = np.empty(keys.size)
    for h in (0, 1):
        fit, score = half != h, half == h
        uniq, inv = np.unique(keys[fit], return_inverse=True)
        rate = np.bincount(inv, weights=y[fit], minlength=uniq.size) / np.bincount(inv, minlength=uniq.size)
        at = np.minimum(np.searchsorted(uniq, keys[score]), uniq.size - 1)
        out[score] = np.where(uniq[at] == keys[score], rate[at], y[fit].mean())
    return out


def sample_separation(
    features_url: str,
    *,
    dense_names: Mapping[str, str],
    key_names: Mapping[str, str],
    date: str,
    max_auc: float,
    max_missing: float,
    storage_options: dict[str, Any] | None = None,
) -> Found:
    """`label_separation` on a seeded sample of the day's train rows (`features_url/train`); `dense_names` and
    `key_names`: feature column (`d_0`, `k_3`) -> the schema's field name, which the detail names."""
    from storage.io import fsio
    from trainer.eval.scoring_pass import sample_rows

    columns = ["label", *dense_names, *key_names]
    frame = sample_rows(
        fsio.join(features_url, "train"),
        columns,
        SAMPLE_ROWS,
        seed=[0, int(date.replace("-", ""))],
        storage_options=storage_options,
    ).frame
    return label_separation(
        frame["label"].to_numpy(),
        {f"{n} ({c})": frame[c].to_numpy() for c, n in dense_names.items()},
        {f"{n} ({c})": frame[c].to_numpy() for c, n in key_names.items()},
        max_auc=max_auc,
        max_missing=max_missing,
    )
