"""The rows a companion is fit on (`trainer.companion.rows`): the lineage's, newest first, never past the cap;
a source that is gone or lacks the own keys is skipped and named, or refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from storage.features_manifest import FeaturesManifest
from storage.io.fsio import SUCCESS
from tests.trainer.companion.splits import FAST, SCHEMA, write_split
from trainer.companion.fit import fit_for_spec
from trainer.companion.rows import candidate_sources, read_rows


def test_the_sources_are_the_parents_then_its_eval_rows_then_the_days_train_rows():
    parent = {
        "sources": [
            {"features_url": "f1", "split": "train", "rows": 10},
            {"features_url": "f1", "split": "eval", "rows": 2},
        ]
    }
    assert candidate_sources(parent, "f2", "f3") == [
        ("f1", "train", 10),
        ("f1", "eval", 2),
        ("f2", "eval", None),
        ("f3", "train", None),
    ]
    assert candidate_sources(None, None, "f1") == [("f1", "train", None)]  # a first day


def test_rows_are_the_newest_under_the_cap_in_time_order(tmp_path):
    day1 = write_split(tmp_path, "d1", "train", 0, 50)
    write_split(tmp_path, "d1", "eval", 50, 10)
    day2 = write_split(tmp_path, "d2", "train", 60, 40)
    candidates = [(day1, "train", 50), (day1, "eval", None), (day2, "train", None)]
    keys, dense, labels, sources, skipped = read_rows(candidates, SCHEMA, 70)
    # the day's 40 train rows, the 10 eval rows before them, and the newest 20 of the 50 before those
    np.testing.assert_array_equal(dense[:, 0], np.arange(30, 100))
    assert keys.shape == (70, 2) and labels.shape == (70,) and skipped == []
    assert [(s.split, s.rows) for s in sources] == [("train", 20), ("eval", 10), ("train", 40)]
    *_, every, _ = read_rows(candidates, SCHEMA, 10_000)
    assert [s.rows for s in every] == [50, 10, 40]
    # a parent's source keeps the rows it had then, even if the directory holds more now
    *_, capped, _ = read_rows([(day1, "train", 5), (day2, "train", None)], SCHEMA, 10_000)
    assert [s.rows for s in capped] == [5, 40]


def test_a_source_that_is_gone_is_skipped_and_named_and_no_rows_at_all_is_refused(tmp_path):
    gone = str(tmp_path / "deleted")
    day = write_split(tmp_path, "d2", "train", 0, 40)
    _, _, labels, sources, skipped = read_rows([(gone, "train", 5), (day, "train", None)], SCHEMA, 100)
    assert len(labels) == 40 and [s.features_url for s in sources] == [day] and skipped == [f"{gone} (train)"]
    _, record = fit_for_spec(
        day,
        SCHEMA,
        100,
        parent={"sources": [{"features_url": gone, "split": "train", "rows": 5}]},
        parent_features_url=None,
        config=FAST,
    )
    assert record["skipped_sources"] == [f"{gone} (train)"] and record["rows"] == 40
    with pytest.raises(FileNotFoundError, match="the day's features .*deleted are gone"):
        read_rows([(gone, "train", None)], SCHEMA, 100)


def test_rows_without_the_values_own_keys_are_refused_saying_how_to_encode_them(tmp_path):
    day = write_split(tmp_path, "d1", "train", 0, 50, raw_keys=False)
    with pytest.raises(ValueError, match="lack the values' own keys.*encode.raw_keys=true"):
        read_rows([(day, "train", None)], SCHEMA, 100)


@pytest.mark.parametrize("manifest", ["undated", "none"])
def test_a_source_whose_manifest_states_no_date_is_refused_naming_its_manifest_and_the_fix(tmp_path, manifest):
    """The guard that keeps the day's own rows out of its companion reads the sources' dates: a source it cannot
    date is refused, never fit unseen (it could be the day's eval rows, the gate's)."""
    undated = write_split(tmp_path, "old", "eval", 0, 30)
    day = write_split(tmp_path, "d2", "train", 30, 40)
    success = tmp_path / "old" / SUCCESS
    if manifest == "undated":
        success.write_text(json.dumps(FeaturesManifest(date=None).to_dict()))
    else:
        success.unlink()
    what = f"have no date .*old/{SUCCESS} states none" if manifest == "undated" else f"old/{SUCCESS} is missing"
    with pytest.raises(ValueError, match=f"rows .*old .*{what}.*--force.*model.companion=off"):
        fit_for_spec(day, SCHEMA, 1_000, parent=None, parent_features_url=undated, config=FAST, auto=True)
    own = tmp_path / "d2" / SUCCESS  # the day's own features alike
    if manifest == "undated":
        own.write_text(success.read_text())
    else:
        own.unlink()
    with pytest.raises(ValueError, match=f"d2/{SUCCESS}"):
        read_rows([(day, "train", None)], SCHEMA, 100)
