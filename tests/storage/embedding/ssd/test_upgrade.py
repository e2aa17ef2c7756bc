"""A shard of 0.1.0's records (`ctr-ssd-shard/2`) or of another row format, converted where it lies: the rows a
restore from the published snapshot would give, and only when the shard holds the rows the day starts from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.store import write_v2_shard
from storage.embedding.config import StoreConfig
from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import SnapshotWriter
from storage.embedding.ssd import disk_format
from storage.embedding.ssd.store import SsdStore
from storage.embedding.ssd.upgrade import convert_shard, cost
from storage.io.records import FormatError
from tests.helpers.formats import sample
from trainer.config import OptimConfig

DIM = 8
DEFAULT = StoreConfig(embedding_dim=DIM).row_format(OptimConfig().sparse_optimizer)
KEYS = np.arange(3000, dtype=np.int64) * 7 + 3


def test_0_1_0_records_are_read_with_their_own_layout() -> None:
    meta = sample("ssd-meta-v2.json")  # what 0.1.0 wrote at dim 8
    layout = disk_format.held_layout(meta, Path("/shard"))
    assert (layout.record_bytes, layout.rows_per_unit, layout.fmt) == (112, 36, RowFormat(DIM, "adam", "fp32"))
    with pytest.raises(FormatError, match="ctr-ssd-shard/4"):
        disk_format.held_layout({**meta, "format": "ctr-ssd-shard/4"}, Path("/shard"))
    with pytest.raises(ValueError, match="record_bytes"):
        disk_format.held_layout({**meta, "record_bytes": 208}, Path("/shard"))


def test_a_0_1_0_shard_converts_where_it_lies_into_the_rows_a_restore_gives(tmp_path) -> None:
    rows = write_v2_shard(tmp_path / "shard", KEYS, tag="v1", dim=DIM)
    snapshot = tmp_path / "published.parquet"  # the same rows, as the published model holds them
    with SnapshotWriter(str(snapshot), RowFormat(DIM, "adam", "fp32")) as w:
        w.write(KEYS, rows)
    with SsdStore(str(tmp_path / "restored"), DEFAULT) as restored:
        restored.restore(str(snapshot))

    done = convert_shard(tmp_path / "shard", DEFAULT, init_std=0.01, tag="v1")
    assert done is not None and done.rows == KEYS.size and done.source == "ctr-ssd-shard/2 adam/fp32"
    assert done.target == f"ctr-ssd-shard/3 {DEFAULT.name}" and "3,000 rows in" in done.summary("s")
    assert disk_format.read_meta(tmp_path / "shard")["format"] == "ctr-ssd-shard/3"
    assert not (tmp_path / "shard.converting").exists() and not (tmp_path / "shard.replaced").exists()
    with SsdStore(str(tmp_path / "shard"), DEFAULT) as got, SsdStore(str(tmp_path / "restored"), DEFAULT) as want:
        assert got.tag == "v1" and len(got) == KEYS.size
        (found, a), (_, b) = got.read_rows(KEYS), want.read_rows(KEYS)
        assert found.all()
        for x, y in zip(a.tensors(), b.tensors(), strict=True):
            assert x.equal(y)


def test_a_v3_shard_of_another_row_format_converts_too(tmp_path) -> None:
    old = RowFormat(DIM, "adam", "int8", "log8")  # the default before the 48-byte rows
    rows = old.convert(write_v2_shard(tmp_path / "v2", KEYS, dim=DIM), RowFormat(DIM, "adam", "fp32"))
    with SsdStore(str(tmp_path / "shard"), old) as s:
        s.write_rows(KEYS, rows)
        s.set_tag("v1")
    done = convert_shard(tmp_path / "shard", DEFAULT, init_std=0.01, tag="v1")
    assert done is not None and done.source == "ctr-ssd-shard/3 adam/int8/log8"
    with SsdStore(str(tmp_path / "shard"), DEFAULT) as s:
        assert len(s) == KEYS.size and s.tag == "v1"
        _, got = s.read_rows(KEYS)
    assert got.tensors()[0].equal(DEFAULT.convert(rows, old).emb)


@pytest.mark.parametrize(
    ("change", "tag", "fmt"),
    [
        ({}, "v2", DEFAULT),  # other rows than the day starts from: the warm stage restores those
        ({}, None, DEFAULT),  # no published model
        ({"clean": False}, "v1", DEFAULT),  # its index may be older than its rows
        ({}, "v1", StoreConfig(embedding_dim=16).row_format(OptimConfig().sparse_optimizer)),  # another width
        ({"format": "ctr-ssd-shard/1"}, "v1", DEFAULT),  # no layout this code knows
    ],
    ids=["other-tag", "no-tag", "unclean", "other-dim", "unknown-version"],
)
def test_a_shard_that_is_not_the_day_s_rows_is_left_for_the_restore(tmp_path, change, tag, fmt) -> None:
    write_v2_shard(tmp_path / "shard", KEYS, tag="v1", dim=DIM)
    meta = disk_format.read_meta(tmp_path / "shard")
    disk_format.write_meta(tmp_path / "shard", {**meta, **change})
    assert convert_shard(tmp_path / "shard", fmt, init_std=0.01, tag=tag) is None
    assert disk_format.read_meta(tmp_path / "shard") == {**meta, **change}  # untouched


def test_the_cost_of_a_rebuild_is_said_per_10_8_rows_when_the_shard_is_big_enough_to_tell():
    assert cost(3000, 0.3) == "3,000 rows in 0.3s"  # mostly fixed costs: not scaled
    assert cost(10**6, 20.0) == "1,000,000 rows in 20.0s, 33 min per 10^8 rows"
    assert cost(10**6, 0.5) == "1,000,000 rows in 0.5s, 50 s per 10^8 rows"
