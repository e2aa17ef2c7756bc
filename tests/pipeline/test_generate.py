"""Synthetic Criteo days: deterministic, skewed, drifting, with a learnable planted click model."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.encode.keys import feature_keys
from pipeline.generate import (
    INTERACTION_FIELDS,
    generate_day,
    generate_days,
    planted_interactions,
)
from pipeline.ingest.parse import read_log_file
from pipeline.schema import CRITEO


def exact_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Mann-Whitney AUC with average ranks for ties."""
    ranks = pd.Series(scores).rank(method="average").to_numpy()
    pos = labels == 1
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@pytest.fixture(scope="module")
def two_days(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    days = generate_days(str(out), 2, 20_000, seed=11, start_date="2026-03-01", with_truth=True)
    return out, days


def test_same_seed_same_bytes_other_seed_other_rows(tmp_path):
    a = generate_days(str(tmp_path / "a"), 1, 500, seed=1)[0]
    b = generate_days(str(tmp_path / "b"), 1, 500, seed=1)[0]
    c = generate_days(str(tmp_path / "c"), 1, 500, seed=2)[0]
    read = lambda d: Path(d.path).read_bytes()  # noqa: E731
    assert read(a) == read(b) and read(a) != read(c)
    assert a.path.endswith("day_2026-01-01.tsv.gz") and a.rows == 500


def test_files_are_valid_criteo_rows_with_missing_values(two_days):
    out, days = two_days
    events, quarantine = read_log_file(days[0].path, "criteo")
    assert len(events) == 20_000 and len(quarantine) == 0
    assert events["C23"].isna().mean() > 0.5 and events["I1"].isna().mean() > 0.3
    assert events["C1"].isna().sum() == 0


def test_click_rate_and_truth_are_consistent_and_learnable(two_days):
    out, days = two_days
    events, _ = read_log_file(days[0].path, "criteo")
    truth = np.load(out / "day_2026-03-01.truth.npy")
    labels = events["label"].to_numpy()
    assert truth.dtype == np.float32 and len(truth) == len(labels)
    assert 0.18 < labels.mean() < 0.32 and abs(days[0].click_rate - labels.mean()) < 1e-9
    assert abs(truth.mean() - labels.mean()) < 0.02
    assert exact_auc(labels, truth) > 0.7


def test_a_tenth_of_the_keys_take_most_lookups(two_days):
    _, days = two_days
    events, _ = read_log_file(days[0].path, "criteo")
    keys = np.concatenate([feature_keys(j, events[c]) for j, c in enumerate(CRITEO.categorical)])
    counts = np.sort(pd.Series(keys).value_counts().to_numpy())[::-1]
    top = counts[: len(counts) // 10].sum() / counts.sum()
    assert top > 0.8


def test_each_day_brings_new_values_while_most_lookups_hit_old_ones(two_days):
    _, days = two_days
    (day1, _), (day2, _) = (read_log_file(d.path, "criteo") for d in days)
    new_rows = ~day2["C3"].isin(set(day1["C3"].dropna())) & day2["C3"].notna()
    assert day2.loc[new_rows, "C3"].nunique() > 100  # new values appear
    assert new_rows.mean() < 0.5  # but the head persists


def test_planted_interactions_are_fixed_by_the_seed() -> None:
    pairs, triple = planted_interactions(3, 8)
    assert (pairs, triple) == planted_interactions(3, 8) and len(set(pairs)) == 8
    assert all(a < b and {a, b} <= set(INTERACTION_FIELDS) for a, b in pairs) and len(set(triple)) == 3
    assert planted_interactions(4, 8) != (pairs, triple)
    assert planted_interactions(3, 0) == ((), None)
    with pytest.raises(ValueError, match=r"interactions must be in \[0, 120\], got 121"):
        planted_interactions(3, 121)


def test_interactions_are_deterministic_per_seed_and_raise_the_ceiling(tmp_path):
    plain_table, plain = generate_day(0, 20_000, seed=7)
    again_table, again = generate_day(0, 20_000, seed=7, interactions=0)
    assert plain_table.equals(again_table) and np.array_equal(plain, again)  # N = 0: the model without them
    table, prob = generate_day(0, 20_000, seed=7, interactions=8)
    same_table, same = generate_day(0, 20_000, seed=7, interactions=8)
    assert table.equals(same_table) and np.array_equal(prob, same)
    assert table.drop_columns(["label"]).equals(plain_table.drop_columns(["label"]))  # only the clicks change
    ceiling = exact_auc(table.column("label").to_numpy(), prob)
    assert ceiling > exact_auc(plain_table.column("label").to_numpy(), plain) + 0.02
    a = generate_days(str(tmp_path / "a"), 1, 500, seed=1, interactions=4)[0]
    b = generate_days(str(tmp_path / "b"), 1, 500, seed=1, interactions=4)[0]
    c = generate_days(str(tmp_path / "c"), 1, 500, seed=1)[0]
    assert Path(a.path).read_bytes() == Path(b.path).read_bytes() != Path(c.path).read_bytes()


def test_days_of_different_sizes(tmp_path) -> None:
    days = generate_days(str(tmp_path), 2, (300, 200), seed=1)
    assert [d.rows for d in days] == [300, 200]
    assert [len(read_log_file(d.path, "criteo")[0]) for d in days] == [300, 200]
    with pytest.raises(ValueError, match="one count, or one per day"):
        generate_days(str(tmp_path), 2, (10,))


def test_keys_widen_the_large_fields_only_and_a_flatter_skew_admits_more(tmp_path) -> None:
    from pipeline.generate import CARDINALITY, KEYED_FIELDS, WEIGHTED_FIELDS, cardinalities, key_counts

    wide = cardinalities(10**7)
    assert sum(wide) == pytest.approx(10**7, rel=1e-6) and cardinalities(None) == CARDINALITY
    assert all((w > c) == (j in KEYED_FIELDS) for j, (w, c) in enumerate(zip(wide, CARDINALITY, strict=True)))
    assert not set(KEYED_FIELDS) & set(WEIGHTED_FIELDS)  # the click model, and so AUC's ceiling, is unchanged
    with pytest.raises(ValueError, match="keys must be >= 898,681"):
        cardinalities(10**5)
    plain, _ = generate_day(0, 20_000, seed=3)
    keyed, _ = generate_day(0, 20_000, seed=3, keys=10**7, zipf=1.0)
    assert keyed.column("label").equals(plain.column("label"))  # same clicks, other values in the large fields
    (d_plain, r_plain), (d_keyed, r_keyed) = key_counts(plain), key_counts(keyed)
    assert d_keyed > 1.5 * d_plain and r_keyed > r_plain  # more distinct keys, and more seen twice (admitted)
    day = generate_days(str(tmp_path), 1, 2_000, seed=3, keys=2 * 10**6)[0]
    assert day.keys > day.repeated > 0
