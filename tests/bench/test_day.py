"""bench.day's comparison of row formats: each other format's backfill on the same days, set beside the
default's by its means over days 2.. (day 1 trains cold)."""

from __future__ import annotations

import pytest

from bench._common import row_format_overrides
from bench.day import compare_formats
from flows.config import RunConfig, with_overrides


def _run(train_s: list[float], ex_per_s: list[float], wall: list[float], auc: list[float | None]) -> dict:
    days = [
        {"seconds": {"train": t}, "train_examples_per_s": e, "wall": w, "auc": a}
        for t, e, w, a in zip(train_s, ex_per_s, wall, auc, strict=True)
    ]
    return {"days": days, "peak_rss": {"rank": 512 * 2**20}}


def test_each_other_format_is_set_beside_the_default_by_its_days_after_the_first() -> None:
    runs = {1000: _run([50, 10, 12], [100, 1000, 1200], [60, 20, 22], [0.6, 0.7, 0.72])}
    others = {(1000, "adam/fp32"): _run([1, 20, 24], [1, 500, 600], [2, 40, 44], [0.5, 0.71, None])}
    base, fp32 = compare_formats(runs, others)
    assert base["format"].endswith("(default)") and base["train_ex_per_s vs_default"] == 1.0
    assert (base["train_s"], base["train_ex_per_s"], base["wall_s"]) == (11, 1100, 21)
    assert fp32["format"] == "adam/fp32" and fp32["train_ex_per_s vs_default"] == pytest.approx(550 / 1100)
    assert fp32["wall vs_default"] == pytest.approx(42 / 21)
    assert base["auc"] == pytest.approx(0.71) and fp32["auc"] == 0.71 and fp32["rank_peak_mib"] == 512


def test_no_other_format_gives_no_table() -> None:
    assert compare_formats({1000: _run([1, 2], [1, 2], [1, 2], [0.5, 0.5])}, {}) == []


def test_a_row_format_name_gives_the_config_keys_of_those_rows() -> None:
    cfg = with_overrides(RunConfig(), row_format_overrides("rmsprop/int8/log8"))
    assert cfg.store.row_format(cfg.optim.sparse_optimizer).name == "rmsprop/int8/log8"
    assert row_format_overrides("adam/fp32")["store.state_dtype"] == "fp32"
    with pytest.raises(ValueError, match="optimizer/row_dtype"):
        row_format_overrides("adam")
