"""bench.quality_data: the shared samples as two training days and a later day, as the product reads them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench.quality_data import REAL_DAYS, dataset_days, real_days, synthetic_days
from pipeline.ingest.parse import read_log_file


@pytest.mark.parametrize("name", ["criteo", "avazu"])
def test_real_samples_split_in_file_order_into_dated_days(name, shared_data, tmp_path) -> None:
    files = real_days(name, tmp_path, data=shared_data)
    assert len(files.train_dates) == 2 and files.later_date > files.train_dates[-1]
    parts = [read_log_file(files.path(d), files.fmt)[0] for d in (*files.train_dates, files.later_date)]
    whole, _ = read_log_file(
        str(shared_data / ("criteo/train_head_10k.tsv" if name == "criteo" else "avazu/avazu_14102100.csv")), files.fmt
    )
    assert [len(p) for p in parts] == [*REAL_DAYS[:2], len(whole) - sum(REAL_DAYS[:2])]  # every row valid, none lost
    got = pd.concat(parts, ignore_index=True)
    np.testing.assert_array_equal(got["label"].to_numpy(), whole["label"].to_numpy())  # file order kept
    if name == "avazu":  # each file's rows carry its own date (the ingest keeps only the day's rows)
        days = [pd.to_datetime(p["ts"], unit="s").dt.strftime("%Y-%m-%d").unique().tolist() for p in parts]
        assert days == [[d] for d in (*files.train_dates, files.later_date)]


def test_the_train_split_is_every_row_but_the_last_days_held_out_tenth(shared_data, tmp_path) -> None:
    files = real_days("criteo", tmp_path, data=shared_data)
    split = files.train_split_events(0.1)
    days = [read_log_file(files.path(d), files.fmt)[0] for d in files.train_dates]
    assert len(split) == 4_000 + 3_600  # day 1's held-out tenth is trained by day 2 (trainer.plan.parent_eval)
    head = pd.concat([days[0], days[1].iloc[:3_600]], ignore_index=True)
    np.testing.assert_array_equal(split["label"].to_numpy(), head["label"].to_numpy())


def test_synthetic_days_hold_a_fifth_for_the_later_day_with_its_truth(tmp_path) -> None:
    files = synthetic_days(2_000, tmp_path, interactions=2)
    assert files.name == "synthetic-2k" and len(files.truth) == 400 == len(files.later_events())
    assert len(files.train_events()) == 1_600
    with pytest.raises(ValueError, match="unknown dataset"):
        dataset_days("synthetic-many", tmp_path, interactions=0)
