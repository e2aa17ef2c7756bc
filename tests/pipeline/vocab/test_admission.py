"""Admission: a key is admitted at min_count, stays admitted within the TTL, and is forgotten otherwise.

The rules run through the stage's `update_bucket` with one bucket holding
every key (`tests.helpers.vocab_days.update_vocab`).
"""

import pandas as pd
import pytest

from pipeline.config import VocabConfig
from pipeline.vocab.counts import count_keys
from tests.helpers.vocab_days import counts, key, update_vocab


def step(date, window: dict, previous, **config):
    return update_vocab(date=date, days=window, previous=previous, config=VocabConfig(**config))


def test_a_key_is_admitted_when_its_windowed_count_reaches_min_count():
    v = step("2026-01-01", {"2026-01-01": counts(a=2, b=1)}, None, min_count=2).vocab.set_index("key")
    assert v.loc[key("a"), "admitted"] and not v.loc[key("b"), "admitted"]
    v2 = step("2026-01-02", {"2026-01-01": counts(a=2, b=1), "2026-01-02": counts(b=1)}, v.reset_index(), min_count=2)
    assert v2.vocab.set_index("key").loc[key("b"), "admitted"]  # 1 + 1 over the window


def test_admission_is_sticky_until_the_key_is_unseen_for_more_than_ttl_days():
    cfg = {"min_count": 2, "window_days": 2, "ttl_days": 3}
    v = step("2026-01-01", {"2026-01-01": counts(a=2)}, None, **cfg).vocab
    for date in ("2026-01-02", "2026-01-03", "2026-01-04"):  # out of the window, within the TTL
        update = step(date, {}, v, **cfg)
        v = update.vocab
        assert v.set_index("key").loc[key("a"), "admitted"] and len(update.evicted) == 0
    update = step("2026-01-05", {}, v, **cfg)  # last seen 4 days ago > ttl_days
    assert update.evicted["key"].tolist() == [key("a")] and update.evicted["last_seen"].tolist() == ["2026-01-01"]
    assert key("a") not in update.vocab["key"].tolist()


def test_seen_again_before_the_ttl_keeps_a_key_and_updates_last_seen():
    cfg = {"min_count": 2, "window_days": 1, "ttl_days": 2}
    v = step("2026-01-01", {"2026-01-01": counts(a=2)}, None, **cfg).vocab
    v = step("2026-01-03", {"2026-01-03": counts(a=1)}, v, **cfg).vocab.set_index("key")
    assert v.loc[key("a"), ["admitted", "first_seen", "last_seen"]].tolist() == [True, "2026-01-01", "2026-01-03"]


def test_never_admitted_keys_are_forgotten_once_out_of_the_window():
    v = step("2026-01-01", {"2026-01-01": counts(b=1)}, None, min_count=2, window_days=1).vocab
    assert step("2026-01-02", {}, v, min_count=2, window_days=1).vocab.empty


def test_per_field_min_count_overrides_the_global_one():
    frame = pd.DataFrame({"A": ["x", "x", "y"], "B": ["x", "x", "y"]})
    days = {"2026-01-01": count_keys(frame, ["A", "B"])}
    cfg = VocabConfig(min_count=2, min_count_per_field={"B": 3})
    v = update_vocab(date="2026-01-01", days=days, previous=None, config=cfg, fields=["A", "B"]).vocab
    assert v.loc[v["admitted"], "key"].tolist() == [key("x")]  # B's x (count 2) stays below 3
    with pytest.raises(ValueError, match="unknown fields"):
        update_vocab(date="2026-01-01", days=days, previous=None, config=cfg, fields=["A"])
