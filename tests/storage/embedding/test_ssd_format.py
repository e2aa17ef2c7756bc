"""The SSD shard format: record and unit layout, records <-> rows, meta.json checks, index files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.compact_index import CompactSlotMap
from storage.embedding.rows import Rows
from storage.embedding.ssd_format import (
    BLOCK,
    FORMAT,
    RecordLayout,
    drop_other_indexes,
    index_name,
    load_index,
    read_meta,
    rows_of,
    write_index,
    write_meta,
)
from storage.io.records import FormatError
from tests.helpers.formats import newer, sample


@pytest.mark.parametrize(
    ("dim", "record_bytes", "unit_bytes", "rows_per_unit"),
    [(8, 12 * 8 + 16, 4096, 4096 // (12 * 8 + 16)), (400, 4816, 8192, 1)],
)
def test_records_pack_into_block_aligned_units(dim, record_bytes, unit_bytes, rows_per_unit) -> None:
    fmt = RecordLayout.of(dim)
    assert (fmt.record_bytes, fmt.unit_bytes, fmt.rows_per_unit) == (record_bytes, unit_bytes, rows_per_unit)
    assert fmt.unit_bytes % BLOCK == 0
    buf = bytearray(3 * fmt.unit_bytes)
    assert fmt.records_of(buf, 3).shape == (3, rows_per_unit)


def test_records_carry_the_rows_and_their_keys() -> None:
    fmt = RecordLayout.of(4)
    gen = torch.Generator().manual_seed(0)
    rows = Rows(torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen), torch.rand(5, 4, generator=gen),
                torch.arange(5, dtype=torch.int64) * 3)
    keys = np.array([9, 2, 7, 1, 0])
    recs = fmt.to_records(keys, rows)
    assert recs["key"].tolist() == keys.tolist()
    back = rows_of(recs)
    for name in ("emb", "m", "v", "clock"):
        assert torch.equal(getattr(back, name), getattr(rows, name)), name


def test_meta_of_another_format_dim_or_layout_is_refused(tmp_path) -> None:
    fmt = RecordLayout.of(8)
    fmt.check(fmt.meta(), tmp_path)  # its own layout passes
    with pytest.raises(ValueError, match="format 'ctr-ssd-shard/1'.*wipe the shard"):
        fmt.check({**fmt.meta(), "format": "ctr-ssd-shard/1"}, tmp_path)
    with pytest.raises(ValueError, match="dim 16, asked for dim 8"):
        fmt.check({**fmt.meta(), "dim": 16}, tmp_path)
    with pytest.raises(ValueError, match="unit_bytes=8192"):
        fmt.check({**fmt.meta(), "unit_bytes": 8192}, tmp_path)
    assert fmt.meta()["format"] == FORMAT


def test_meta_and_index_files_round_trip_and_old_indexes_go(tmp_path) -> None:
    assert read_meta(tmp_path) is None
    write_meta(tmp_path, {"generation": 3, "tag": "v1"})
    assert read_meta(tmp_path) == {"generation": 3, "tag": "v1"}
    m = CompactSlotMap()
    m.insert(np.array([5, 8, 13]), np.array([2, 0, 1]))
    write_index(tmp_path, index_name(2), m)
    write_index(tmp_path, index_name(3), m)
    (tmp_path / f"{index_name(4)}.tmp").write_bytes(b"an interrupted save")
    drop_other_indexes(tmp_path, index_name(3))
    assert sorted(p.name for p in tmp_path.glob("index-*")) == [index_name(3)]
    again = CompactSlotMap()
    load_index(tmp_path, index_name(3), again)
    assert again.lookup(np.array([8, 13, 5, 6])).tolist() == [0, 1, 2, -1] and again.high_water == 3


def test_todays_meta_json_passes_with_fields_it_does_not_know_and_a_newer_version_is_refused(tmp_path) -> None:
    fmt = RecordLayout.of(8)
    fmt.check(sample("ssd-meta-v2.json"), tmp_path)
    fmt.check(newer(sample("ssd-meta-v2.json")), tmp_path)  # a newer writer's extra fields
    with pytest.raises(FormatError, match=r"meta.json has format 'ctr-ssd-shard/3', written by a newer ctr-pipeline; "
                                          r"this code reads ctr-ssd-shard/2: wipe the shard"):
        fmt.check({**sample("ssd-meta-v2.json"), "format": "ctr-ssd-shard/3"}, tmp_path)
