"""The companion: which rows it is fit on (the lineage's, newest first, never past the cap), its inputs, its
file, and the blend."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from storage.features_manifest import FeaturesManifest
from storage.io.fsio import SUCCESS
from storage.key_layout import FIELD_SHIFT
from trainer import companion
from trainer.data import FeatureSchema
from trainer.models.key_counts import KeyCounts
from trainer.models.poly2 import Poly2Config, fit
from trainer.plan.recipe import CROSS_MIN_ROWS

SCHEMA = FeatureSchema(dense_columns=("d_0",), key_columns=("k_0", "k_1"), fields=("C1", "C2"))
FAST = Poly2Config(bits=14, cs=(0.1, 1.0))


def write_split(root, name: str, split: str, first: int, n: int, seed: int = 0, *, raw_keys: bool = True) -> str:
    """A features directory `root/name` whose `split` holds rows numbered first..first+n-1 (d_0 is the number);
    every value is OOV in k_j, its own key in r_j (with `raw_keys`)."""
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
    for i, part in enumerate(np.array_split(np.arange(n), 2)):  # two parts: read in name order
        frame.iloc[part].to_parquet(root / name / split / f"part-{i:05d}.parquet")
    return str(root / name)


def test_the_sources_are_the_parents_then_its_eval_rows_then_the_days_train_rows():
    parent = {
        "sources": [
            {"features_url": "f1", "split": "train", "rows": 10},
            {"features_url": "f1", "split": "eval", "rows": 2},
        ]
    }
    assert companion.candidate_sources(parent, "f2", "f3") == [
        ("f1", "train", 10),
        ("f1", "eval", 2),
        ("f2", "eval", None),
        ("f3", "train", None),
    ]
    assert companion.candidate_sources(None, None, "f1") == [("f1", "train", None)]  # a first day


def test_rows_are_the_newest_under_the_cap_in_time_order(tmp_path):
    day1 = write_split(tmp_path, "d1", "train", 0, 50)
    write_split(tmp_path, "d1", "eval", 50, 10)
    day2 = write_split(tmp_path, "d2", "train", 60, 40)
    candidates = [(day1, "train", 50), (day1, "eval", None), (day2, "train", None)]
    keys, dense, labels, sources, skipped = companion.read_rows(candidates, SCHEMA, 70)
    # the day's 40 train rows, the 10 eval rows before them, and the newest 20 of the 50 before those
    np.testing.assert_array_equal(dense[:, 0], np.arange(30, 100))
    assert keys.shape == (70, 2) and labels.shape == (70,) and skipped == []
    assert [(s.split, s.rows) for s in sources] == [("train", 20), ("eval", 10), ("train", 40)]
    *_, every, _ = companion.read_rows(candidates, SCHEMA, 10_000)
    assert [s.rows for s in every] == [50, 10, 40]
    # a parent's source keeps the rows it had then, even if the directory holds more now
    *_, capped, _ = companion.read_rows([(day1, "train", 5), (day2, "train", None)], SCHEMA, 10_000)
    assert [s.rows for s in capped] == [5, 40]


def test_a_source_that_is_gone_is_skipped_and_named_and_no_rows_at_all_is_refused(tmp_path):
    gone = str(tmp_path / "deleted")
    day = write_split(tmp_path, "d2", "train", 0, 40)
    _, _, labels, sources, skipped = companion.read_rows([(gone, "train", 5), (day, "train", None)], SCHEMA, 100)
    assert len(labels) == 40 and [s.features_url for s in sources] == [day] and skipped == [f"{gone} (train)"]
    _, record = companion.fit_for_spec(
        day,
        SCHEMA,
        100,
        parent={"sources": [{"features_url": gone, "split": "train", "rows": 5}]},
        parent_features_url=None,
        config=FAST,
    )
    assert record["skipped_sources"] == [f"{gone} (train)"] and record["rows"] == 40
    with pytest.raises(FileNotFoundError, match="no rows to fit: every source was skipped.*deleted"):
        companion.read_rows([(gone, "train", None)], SCHEMA, 100)


def test_the_fit_and_its_file_score_the_same_and_its_record_says_what_it_did(tmp_path):
    day = write_split(tmp_path, "d1", "train", 0, 600)
    fitted, record = companion.fit_for_spec(day, SCHEMA, 10_000, parent=None, parent_features_url=None, config=FAST)
    assert record["kind"] == "poly2" and record["rows"] == 600 and record["C"] in FAST.cs
    assert set(record["holdout_logloss"]) == {"0.1", "1.0"} and record["bits"] == 14
    assert record["sources"] == [{"features_url": day, "split": "train", "rows": 600}]
    keys, dense, labels, _, _ = companion.read_rows([(day, "train", None)], SCHEMA, 10_000)
    z = fitted.logits(keys, dense)
    companion.save(str(tmp_path / "c.safetensors"), fitted)
    again = companion.load(str(tmp_path / "c.safetensors"))
    np.testing.assert_array_equal(again.logits(keys, dense), z)  # the saved (float32) weights are the ones fit
    from trainer.metrics import auc

    assert auc(labels, z) > 0.65  # it learnt the pair a == b from the own keys (every k_j is the OOV key)


def test_a_day_keeps_its_parents_c_until_its_rows_double_or_a_week_of_fits_has_used_it():
    parent = {
        "kind": "poly2",
        "bits": 22,
        "inputs": companion.INPUTS,
        "C": 0.003,
        "C_chosen": {"rows": 4_000, "fits_ago": 0},
    }
    assert companion.kept_c(parent, 7_999) == {"C": 0.003, "rows": 4_000, "fits_ago": 0}
    assert companion.kept_c(parent, 8_000) is None  # twice the rows: cross-validation chooses again
    week = {**parent, "C_chosen": {"rows": 4_000, "fits_ago": companion.C_SEARCH_FITS - 2}}
    assert companion.kept_c(week, 4_000) is not None
    assert (
        companion.kept_c({**week, "C_chosen": {"rows": 4_000, "fits_ago": companion.C_SEARCH_FITS - 1}}, 4_000) is None
    )
    # no parent, a parent whose C was chosen before the record said how, or on another grid: the split
    assert companion.kept_c(None, 100) is None
    assert companion.kept_c({k: v for k, v in parent.items() if k != "C_chosen"}, 100) is None
    assert companion.kept_c({**parent, "C": 0.002}, 100) is None
    assert companion.kept_c({**parent, "bits": 14}, 100) is None
    assert companion.kept_c({k: v for k, v in parent.items() if k != "inputs"}, 100) is None  # pairs alone: no counts


def test_a_kept_c_is_refit_on_the_days_rows_and_the_record_says_when_it_was_chosen(tmp_path):
    day1 = write_split(tmp_path, "d1", "train", 0, 600)
    day2 = write_split(tmp_path, "d2", "train", 600, 300)
    _, first = companion.fit_for_spec(day1, SCHEMA, 10_000, parent=None, parent_features_url=None, config=FAST)
    assert first["C_chosen"] == {"rows": 600, "fits_ago": 0} and len(first["holdout_logloss"]) >= 1
    kept = {**first, "C": 1.0 if first["C"] == 0.1 else 0.1}  # the other C of the grid: kept, not chosen again
    fitted, second = companion.fit_for_spec(day2, SCHEMA, 10_000, parent=kept, parent_features_url=None, config=FAST)
    assert second["rows"] == 900 and second["C"] == kept["C"] and second["holdout_logloss"] == {}
    assert second["C_chosen"] == {"rows": 600, "fits_ago": 1} and second["C"] == fitted.poly2.C
    # its weights are that C's minimum on the day's rows: the same as a fit from nothing at that C
    keys, dense, labels, _, _ = companion.read_rows(companion.candidate_sources(kept, None, day2), SCHEMA, 10_000)
    ids, log_dense = companion.inputs(keys, dense, FAST.bits, KeyCounts.of(keys), fit_rows=True)
    cold = fit(ids, log_dense, labels, kept["C"], config=FAST)
    np.testing.assert_allclose(fitted.logits(keys, dense), cold.logits(ids, log_dense), atol=1e-4)


def test_rows_without_the_values_own_keys_are_refused_saying_how_to_encode_them(tmp_path):
    day = write_split(tmp_path, "d1", "train", 0, 50, raw_keys=False)
    with pytest.raises(ValueError, match="lack the values' own keys.*encode.raw_keys=true"):
        companion.read_rows([(day, "train", None)], SCHEMA, 100)


def test_a_bad_or_missing_file_is_refused_saying_retrain(tmp_path):
    with pytest.raises(FileNotFoundError, match="names a companion; retrain"):
        companion.load(str(tmp_path / "missing.safetensors"))
    with pytest.raises(ValueError, match="x.safetensors is not a companion file.*retrain"):
        companion.from_bytes(b"not safetensors", "x.safetensors")


def test_rows_of_one_label_are_refused(tmp_path):
    day = write_split(tmp_path, "d1", "train", 0, 50)
    frame = pd.read_parquet(f"{day}/train/part-00000.parquet")
    frame["label"] = 0.0
    frame.to_parquet(f"{day}/train/part-00000.parquet")
    pd.read_parquet(f"{day}/train/part-00001.parquet").assign(label=0.0).to_parquet(f"{day}/train/part-00001.parquet")
    with pytest.raises(ValueError, match="all of one label.*model.companion=auto"):
        companion.fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=None, config=FAST)
    # auto: such a day gets no companion, and trains
    assert (
        companion.fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=None, config=FAST, auto=True) is None
    )


def test_auto_gives_a_companion_to_days_too_small_for_the_cross_term_encoded_with_their_own_keys():
    small = FeaturesManifest(rows_train=CROSS_MIN_ROWS - 1, raw_keys=True)
    large = FeaturesManifest(rows_train=CROSS_MIN_ROWS, raw_keys=True)
    assert companion.why_none("auto", small) is None
    assert "10,000 train rows are not fewer than 10,000" in companion.why_none("auto", large)
    assert "no own keys" in companion.why_none("auto", FeaturesManifest(rows_train=900, raw_keys=False))
    assert companion.why_none("poly2", large) is None  # poly2: every day (its rows are checked when read)
    assert companion.why_none("off", small) == "model.companion is off"


def test_auto_fits_past_a_lineage_day_without_own_keys_and_names_it(tmp_path):
    big = write_split(tmp_path, "big", "eval", 0, 30, raw_keys=False)  # the parent's day: encoded without them
    day = write_split(tmp_path, "d2", "train", 30, 40)
    _, record = companion.fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=big, config=FAST, auto=True)
    assert record["rows"] == 40 and record["skipped_sources"] == [f"{big} (eval): no own keys"]
    with pytest.raises(ValueError, match="lack the values' own keys"):  # poly2 asked for them on every day
        companion.fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=big, config=FAST)


def test_the_inputs_bucket_the_dense_columns_after_the_key_fields_and_add_each_keys_count_token_alone():
    keys = np.array([[2, (1 << FIELD_SHIFT) | 5]], dtype=np.int64)
    ids, d = companion.inputs(keys, np.array([[np.log1p(3.0)]], dtype=np.float32), 20, None)
    assert ids.shape == (1, 3 + 3) and d.dtype == np.float64  # 2 keys and 1 bucket token, and their 3 pairs
    no_dense, d0 = companion.inputs(keys, None, 20, None)
    assert no_dense.shape == (1, 2 + 1) and d0.shape == (1, 0)
    counted, _ = companion.inputs(keys, np.array([[1.0]]), 20, KeyCounts.of(keys))
    assert counted.shape == (1, 6 + 2)  # and each key's count class, alone (no pairs)
    np.testing.assert_array_equal(counted[:, :6], ids)
    own_fields = KeyCounts.of(keys).tokens(keys, leave_one_out=False) >> FIELD_SHIFT
    np.testing.assert_array_equal(own_fields, [[0, 1]])


def test_a_fit_counts_its_rows_keys_and_a_scorer_counts_against_the_fit_rows_only(tmp_path):
    """A value seen once in the fit rows is, left out of its own count, a value never seen: the class a later
    row's new value gets.  The counts travel in the file, and a file of the pairs alone scores as before."""
    day = write_split(tmp_path, "d1", "train", 0, 300)
    fitted, record = companion.fit_for_spec(day, SCHEMA, 1_000, parent=None, parent_features_url=None, config=FAST)
    keys, dense, *_ = companion.read_rows([(day, "train", None)], SCHEMA, 1_000)
    assert record["inputs"] == companion.INPUTS and fitted.counts is not None
    assert fitted.counts.count(keys).min() >= 1 and fitted.counts.counts.sum() == keys.size
    again = companion.from_bytes(companion.to_bytes(fitted), "c.safetensors")
    assert again.counts is not None and np.array_equal(again.counts.keys, fitted.counts.keys)
    np.testing.assert_array_equal(again.logits(keys, dense), fitted.logits(keys, dense))
    pairs_only = companion.Companion(fitted.poly2, fitted.bits, None)  # as a file before the counts loads
    assert companion.from_bytes(companion.to_bytes(pairs_only), "old.safetensors").counts is None
    assert not np.allclose(pairs_only.logits(keys, dense), fitted.logits(keys, dense))  # the classes weigh
    new = np.array([[999, (1 << FIELD_SHIFT) | 999]], dtype=np.int64)
    once = np.array([[7, (1 << FIELD_SHIFT) | 8]], dtype=np.int64)
    counts = KeyCounts.of(np.concatenate([once, keys]))
    np.testing.assert_array_equal(counts.tokens(once, leave_one_out=True), counts.tokens(new, leave_one_out=False))


def test_the_blend_is_the_mean_logit():
    np.testing.assert_allclose(companion.blend(np.array([1.0, -3.0]), np.array([3.0, 1.0])), [2.0, -1.0])


def test_a_rerun_or_an_older_day_never_fits_the_days_eval_rows_or_its_train_rows_twice(tmp_path):
    """The parent of a rerun was trained on the same date: its eval rows are the gate's rows of today."""

    def dated(name: str, date: str) -> str:
        url = write_split(tmp_path, name, "train", 0, 40)
        write_split(tmp_path, name, "eval", 40, 10)
        (tmp_path / name / SUCCESS).write_text(json.dumps(FeaturesManifest(date=date).to_dict()))
        return url

    older, today, newer = dated("d1", "2026-01-01"), dated("d2", "2026-01-02"), dated("d3", "2026-01-03")
    parent = {
        "sources": [
            {"features_url": older, "split": "train", "rows": 40},
            {"features_url": today, "split": "train", "rows": 40},
        ]
    }
    _, record = companion.fit_for_spec(today, SCHEMA, 1_000, parent=parent, parent_features_url=today, config=FAST)
    assert [(s["features_url"], s["split"]) for s in record["sources"]] == [(older, "train"), (today, "train")]
    assert record["rows"] == 80 and record["skipped_sources"] == [
        f"{today} (eval): not before 2026-01-02",
        f"{today} (train): not before 2026-01-02",
    ]
    # a backfill of an older day from a newer parent: the newer day's rows are later than the day's
    _, back = companion.fit_for_spec(older, SCHEMA, 1_000, parent=None, parent_features_url=newer, config=FAST)
    assert back["rows"] == 40 and back["skipped_sources"] == [f"{newer} (eval): not before 2026-01-01"]
