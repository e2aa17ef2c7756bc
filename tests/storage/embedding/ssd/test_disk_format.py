"""The SSD shard format: record and unit layout, records <-> rows, meta.json checks, index files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.compact_index import CompactSlotMap
from storage.embedding.ssd.disk_format import (
    BLOCK,
    FORMAT,
    RecordLayout,
    drop_other_indexes,
    index_name,
    load_index,
    read_meta,
    write_index,
    write_meta,
)
from storage.io.records import FormatError
from tests.helpers.formats import newer, sample
from tests.helpers.stores import FORMATS, random_rows

COMPACT = RowFormat(8, "rowwise_adagrad", "fp16")


@pytest.mark.parametrize(
    ("fmt", "record_bytes", "unit_bytes", "rows_per_unit"),
    [
        (RowFormat(8), 12 * 8 + 12, 4096, 4096 // (12 * 8 + 12)),
        (COMPACT, 2 * 8 + 16, 4096, 128),
        (RowFormat(16, "rowwise_adagrad", "fp16"), 48, 4096, 85),
        (RowFormat(400), 4812, 8192, 1),
    ],
    ids=["adam-fp32-8", "adagrad-fp16-8", "adagrad-fp16-16", "adam-fp32-400"],
)
def test_records_pack_into_block_aligned_units(fmt, record_bytes, unit_bytes, rows_per_unit) -> None:
    layout = RecordLayout.of(fmt)
    assert (layout.record_bytes, layout.unit_bytes, layout.rows_per_unit) == (record_bytes, unit_bytes, rows_per_unit)
    assert layout.unit_bytes % BLOCK == 0
    buf = bytearray(3 * layout.unit_bytes)
    assert layout.records_of(buf, 3).shape == (3, rows_per_unit)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_records_carry_the_rows_and_their_keys(fmt) -> None:
    layout = RecordLayout.of(fmt)
    rows = random_rows(fmt, 5, torch.Generator().manual_seed(0))
    keys = np.array([9, 2, 7, 1, 0])
    recs = layout.to_records(keys, rows)
    assert recs["key"].tolist() == keys.tolist()
    back = layout.rows_of(recs)
    assert sorted(back.state) == sorted(rows.state)
    for a, b in zip(back.tensors(), rows.tensors(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    with pytest.raises(ValueError, match="optimizer state"):
        RecordLayout.of(RowFormat(fmt.dim, "sgd" if fmt.optimizer != "sgd" else "adam", fmt.row_dtype)).to_records(
            keys, rows
        )


def test_meta_of_another_format_dim_or_layout_is_refused(tmp_path) -> None:
    fmt = RecordLayout.of(RowFormat(8))
    fmt.check(fmt.meta(), tmp_path)  # its own layout passes
    with pytest.raises(ValueError, match="format 'ctr-ssd-shard/1'.*wipe the shard"):
        fmt.check({**fmt.meta(), "format": "ctr-ssd-shard/1"}, tmp_path)
    with pytest.raises(ValueError, match="dim 16, asked for dim 8"):
        fmt.check({**fmt.meta(), "dim": 16}, tmp_path)
    with pytest.raises(ValueError, match="unit_bytes=8192"):
        fmt.check({**fmt.meta(), "unit_bytes": 8192}, tmp_path)
    with pytest.raises(
        ValueError,
        match=r"holds rowwise_adagrad/fp16 rows \(optimizer/row dtype\[/state dtype\]\), "
        r"asked for adam/fp32",
    ):
        fmt.check(RecordLayout.of(RowFormat(8, "rowwise_adagrad", "fp16")).meta(), tmp_path)
    with pytest.raises(ValueError, match=r"holds adam/int8/log8 rows .*asked for adam/fp32; .*store.state_dtype"):
        fmt.check(RecordLayout.of(RowFormat(8, "adam", "int8", "log8")).meta(), tmp_path)
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


def test_todays_meta_json_passes_with_fields_it_does_not_know_and_other_versions_are_refused(tmp_path) -> None:
    fmt = RecordLayout.of(COMPACT)
    fmt.check(sample("ssd-meta-v3.json"), tmp_path)
    fmt.check(newer(sample("ssd-meta-v3.json")), tmp_path)  # a newer writer's extra fields
    with pytest.raises(
        FormatError,
        match=r"meta.json has format 'ctr-ssd-shard/4', written by a newer ctr-pipeline; "
        r"this code reads ctr-ssd-shard/3: wipe the shard",
    ):
        fmt.check({**sample("ssd-meta-v3.json"), "format": "ctr-ssd-shard/4"}, tmp_path)
    # a shard of the releases before compact rows (fp32 + Adam records, int64 clocks) is never read as one of these
    with pytest.raises(FormatError, match=r"'ctr-ssd-shard/2'.*wipe the shard"):
        RecordLayout.of(RowFormat(8)).check(sample("ssd-meta-v2.json"), tmp_path)
