"""The companion's fit (`trainer.companion.fit`): whether a day gets one, its C chosen or kept, its record, and
the rows it never fits."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from storage.features_manifest import FeaturesManifest
from storage.io.fsio import SUCCESS
from storage.key_layout import FIELD_SHIFT
from tests.trainer.companion.splits import FAST, SCHEMA, write_split
from trainer.companion.file import from_bytes, load, save, to_bytes
from trainer.companion.fit import C_SEARCH_FITS, fit_for_spec, kept_c, why_none
from trainer.companion.key_counts import KeyCounts
from trainer.companion.model import INPUTS, Companion, inputs
from trainer.companion.poly2 import fit
from trainer.companion.rows import candidate_sources, read_rows
from trainer.plan.recipe import CROSS_MIN_ROWS


def test_the_fit_and_its_file_score_the_same_and_its_record_says_what_it_did(tmp_path):
    day = write_split(tmp_path, "d1", "train", 0, 600)
    fitted, record = fit_for_spec(day, SCHEMA, 10_000, parent=None, parent_features_url=None, config=FAST)
    assert record["kind"] == "poly2" and record["rows"] == 600 and record["C"] in FAST.cs
    assert set(record["holdout_logloss"]) == {"0.1", "1.0"} and record["bits"] == 14
    assert record["sources"] == [{"features_url": day, "split": "train", "rows": 600}]
    keys, dense, labels, _, _ = read_rows([(day, "train", None)], SCHEMA, 10_000)
    z = fitted.logits(keys, dense)
    save(str(tmp_path / "c.safetensors"), fitted)
    again = load(str(tmp_path / "c.safetensors"), blend_weight=fitted.blend_weight)
    np.testing.assert_array_equal(again.logits(keys, dense), z)  # the saved (float32) weights are the ones fit
    from trainer.eval.metrics import auc

    assert auc(labels, z) > 0.65  # it learnt the pair a == b from the own keys (every k_j is the OOV key)


def test_a_day_keeps_its_parents_c_until_its_rows_double_or_a_week_of_fits_has_used_it():
    parent = {
        "kind": "poly2",
        "bits": 22,
        "inputs": INPUTS,
        "C": 0.003,
        "C_chosen": {"rows": 4_000, "fits_ago": 0},
    }
    assert kept_c(parent, 7_999) == {"C": 0.003, "rows": 4_000, "fits_ago": 0}
    assert kept_c(parent, 8_000) is None  # twice the rows: cross-validation chooses again
    week = {**parent, "C_chosen": {"rows": 4_000, "fits_ago": C_SEARCH_FITS - 2}}
    assert kept_c(week, 4_000) is not None
    assert kept_c({**week, "C_chosen": {"rows": 4_000, "fits_ago": C_SEARCH_FITS - 1}}, 4_000) is None
    # no parent, a parent whose C was chosen before the record said how, or on another grid: the split
    assert kept_c(None, 100) is None
    assert kept_c({k: v for k, v in parent.items() if k != "C_chosen"}, 100) is None
    assert kept_c({**parent, "C": 0.002}, 100) is None
    assert kept_c({**parent, "bits": 14}, 100) is None
    assert kept_c({k: v for k, v in parent.items() if k != "inputs"}, 100) is None  # pairs alone: no counts


def test_a_kept_c_is_refit_on_the_days_rows_and_the_record_says_when_it_was_chosen(tmp_path):
    day1 = write_split(tmp_path, "d1", "train", 0, 600)
    day2 = write_split(tmp_path, "d2", "train", 600, 300)
    _, first = fit_for_spec(day1, SCHEMA, 10_000, parent=None, parent_features_url=None, config=FAST)
    assert first["C_chosen"] == {"rows": 600, "fits_ago": 0} and len(first["holdout_logloss"]) >= 1
    kept = {**first, "C": 1.0 if first["C"] == 0.1 else 0.1}  # the other C of the grid: kept, not chosen again
    fitted, second = fit_for_spec(day2, SCHEMA, 10_000, parent=kept, parent_features_url=None, config=FAST)
    assert second["rows"] == 900 and second["C"] == kept["C"] and second["holdout_logloss"] == {}
    assert second["C_chosen"] == {"rows": 600, "fits_ago": 1} and second["C"] == fitted.poly2.C
    # its weights are that C's minimum on the day's rows: the same as a fit from nothing at that C
    keys, dense, labels, _, _ = read_rows(candidate_sources(kept, None, day2), SCHEMA, 10_000)
    ids, log_dense = inputs(keys, dense, FAST.bits, KeyCounts.of(keys), fit_rows=True)
    cold = fit(ids, log_dense, labels, kept["C"], config=FAST)
    np.testing.assert_allclose(fitted.logits(keys, dense), cold.logits(ids, log_dense), atol=1e-4)


def test_rows_of_one_label_are_refused(tmp_path):
    day = write_split(tmp_path, "d1", "train", 0, 50)
    frame = pd.read_parquet(f"{day}/train/part-00000.parquet")
    frame["label"] = 0.0
    frame.to_parquet(f"{day}/train/part-00000.parquet")
    pd.read_parquet(f"{day}/train/part-00001.parquet").assign(label=0.0).to_parquet(f"{day}/train/part-00001.parquet")
    with pytest.raises(ValueError, match="all of one label.*model.companion=auto"):
        fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=None, config=FAST)
    # auto: such a day gets no companion, and trains
    assert fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=None, config=FAST, auto=True) is None


def test_auto_gives_a_companion_to_days_too_small_for_the_cross_term_encoded_with_their_own_keys():
    small = FeaturesManifest(rows_train=CROSS_MIN_ROWS - 1, raw_keys=True)
    large = FeaturesManifest(rows_train=CROSS_MIN_ROWS, raw_keys=True)
    assert why_none("auto", small) is None
    assert "10,000 train rows are not fewer than 10,000" in why_none("auto", large)
    assert "no own keys" in why_none("auto", FeaturesManifest(rows_train=900, raw_keys=False))
    assert why_none("poly2", large) is None  # poly2: every day (its rows are checked when read)
    assert why_none("off", small) == "model.companion is off"


def test_auto_fits_past_a_lineage_day_without_own_keys_and_names_it(tmp_path):
    big = write_split(tmp_path, "big", "eval", 0, 30, raw_keys=False)  # the parent's day: encoded without them
    day = write_split(tmp_path, "d2", "train", 30, 40)
    _, record = fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=big, config=FAST, auto=True)
    assert record["rows"] == 40 and record["skipped_sources"] == [f"{big} (eval): no own keys"]
    with pytest.raises(ValueError, match="lack the values' own keys"):  # poly2 asked for them on every day
        fit_for_spec(day, SCHEMA, 100, parent=None, parent_features_url=big, config=FAST)


def test_a_fit_counts_its_rows_keys_and_a_scorer_counts_against_the_fit_rows_only(tmp_path):
    """A value seen once in the fit rows is, left out of its own count, a value never seen: the class a later
    row's new value gets.  The counts travel in the file, and a file of the pairs alone scores as before."""
    day = write_split(tmp_path, "d1", "train", 0, 300)
    fitted, record = fit_for_spec(day, SCHEMA, 1_000, parent=None, parent_features_url=None, config=FAST)
    keys, dense, *_ = read_rows([(day, "train", None)], SCHEMA, 1_000)
    assert record["inputs"] == INPUTS and fitted.counts is not None
    assert fitted.counts.count(keys).min() >= 1 and fitted.counts.counts.sum() == keys.size
    again = from_bytes(to_bytes(fitted), "c.safetensors", blend_weight=0.5)
    assert again.counts is not None and np.array_equal(again.counts.keys, fitted.counts.keys)
    np.testing.assert_array_equal(again.logits(keys, dense), fitted.logits(keys, dense))
    pairs_only = Companion(fitted.poly2, fitted.bits, None, 0.5)  # as a file before the counts loads
    assert from_bytes(to_bytes(pairs_only), "old.safetensors", blend_weight=0.5).counts is None
    assert not np.allclose(pairs_only.logits(keys, dense), fitted.logits(keys, dense))  # the classes weigh
    new = np.array([[999, (1 << FIELD_SHIFT) | 999]], dtype=np.int64)
    once = np.array([[7, (1 << FIELD_SHIFT) | 8]], dtype=np.int64)
    counts = KeyCounts.of(np.concatenate([once, keys]))
    np.testing.assert_array_equal(counts.tokens(once, leave_one_out=True), counts.tokens(new, leave_one_out=False))


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
    _, record = fit_for_spec(today, SCHEMA, 1_000, parent=parent, parent_features_url=today, config=FAST)
    assert [(s["features_url"], s["split"]) for s in record["sources"]] == [(older, "train"), (today, "train")]
    assert record["rows"] == 80 and record["skipped_sources"] == [
        f"{today} (eval): not before 2026-01-02",
        f"{today} (train): not before 2026-01-02",
    ]
    # a backfill of an older day from a newer parent: the newer day's rows are later than the day's
    _, back = fit_for_spec(older, SCHEMA, 1_000, parent=None, parent_features_url=newer, config=FAST)
    assert back["rows"] == 40 and back["skipped_sources"] == [f"{newer} (eval): not before 2026-01-01"]


def test_the_record_says_how_the_fit_stopped_and_the_blend_weight_it_is_scored_with(tmp_path, caplog):
    day = write_split(tmp_path, "d1", "train", 0, 600)
    fitted, record = fit_for_spec(
        day, SCHEMA, 10_000, parent=None, parent_features_url=None, config=FAST, blend_weight=0.7
    )
    assert record["convergence"]["converged"] is True and record["convergence"]["stop"] == "tolerance"
    assert record["convergence"]["newton_steps"] >= 1 and record["convergence"]["grad_norm"] > 0
    assert record["blend_weight"] == fitted.blend_weight == 0.7
    short = dataclasses.replace(FAST, newton_steps=1, tol=1e-12)
    with caplog.at_level("WARNING", logger="trainer.companion.poly2"):
        _, unconverged = fit_for_spec(day, SCHEMA, 10_000, parent=None, parent_features_url=None, config=short)
    assert unconverged["convergence"]["converged"] is False and unconverged["convergence"]["stop"] == "newton_steps"
    assert "(the refit on every row) of 600 rows" in caplog.text and "stopped unconverged" in caplog.text
