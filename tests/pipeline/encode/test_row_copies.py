"""Row hashes: exact copies hash alike wherever they sit in the files; the duplicate share and its sample."""

import numpy as np

from pipeline.encode import row_copies
from pipeline.ingest.parse import parse_chunk
from pipeline.schema import CRITEO


def _events(lines: list[str]):
    return parse_chunk("\n".join(lines).encode(), schema=CRITEO, file="t").events


def _line(label: str = "1", i1: str = "3", c1: str = "a") -> str:
    return "\t".join([label, i1, *[""] * 12, c1, *["x"] * 25])


def test_copies_hash_alike_at_any_line_and_any_field_change_shows():
    events = _events([_line(), _line(label="0"), _line(i1="4"), _line(c1="b"), _line(), _line(c1="")])
    h = row_copies.row_hashes(events, CRITEO)
    assert h.dtype == np.uint64
    assert h[0] == h[4]  # the same content at another line (another `order`)
    assert len(set(h[:4].tolist())) == 4 and h[5] not in set(h[:5].tolist())


def test_keys_given_by_the_caller_give_the_same_hashes():
    from pipeline.encode.keys import feature_keys

    events = _events([_line(), _line(c1="b")])
    keys = {j: feature_keys(j, events[name]) for j, name in enumerate(CRITEO.categorical)}
    np.testing.assert_array_equal(row_copies.row_hashes(events, CRITEO, keys), row_copies.row_hashes(events, CRITEO))


def test_the_duplicate_share_is_exact_on_a_small_day_and_sampled_on_a_big_one():
    rows = np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # 1000 distinct hashes
    replay = np.concatenate([rows] * 10)
    assert row_copies.duplicate_share(replay) == 0.9 and row_copies.duplicate_share(rows) == 0.0
    assert row_copies.duplicate_share(np.empty(0, np.uint64)) == 0.0
    assert row_copies.sample_bits(1000) == 0 and row_copies.sample_bits(4 << 20) == 2
    sampled = row_copies.sample(replay, 2)
    assert 0 < len(sampled) < len(replay) and len(sampled) % 10 == 0  # every copy of a sampled row, or none
    assert row_copies.duplicate_share(sampled) == 0.9


def test_copies_in_are_the_eval_hashes_a_train_row_has():
    got = row_copies.copies_in(np.array([5, 3, 3, 9], np.uint64), np.array([1, 3, 9], np.uint64))
    assert got.tolist() == [3, 9]
    assert row_copies.copies_in(np.empty(0, np.uint64), np.array([1], np.uint64)).tolist() == []
