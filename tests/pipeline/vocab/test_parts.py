"""Vocab parts: written for cheap rereading (plain string dates, required, uncompressed), read back by bucket
whatever the bucket count they were written with."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from pipeline.encode.keys import field_of
from pipeline.vocab.buckets import bucket_of
from pipeline.vocab.dates import day_dictionary
from pipeline.vocab.parts import Bucketed, part_name, read_bucket, write_vocab_part

FS = LocalFileSystem()


def vocab_columns(rng, n: int, date: int = 20454) -> dict[str, np.ndarray]:
    keys = np.unique((rng.integers(0, 3, n) << 56) | rng.integers(2, 1 << 56, n))
    count = rng.integers(0, 9, len(keys))
    return {
        "field": field_of(keys).astype(np.int16),
        "key": keys,
        "count": count,
        "score": count.astype(np.float64),
        "first_seen": date - rng.integers(0, 30, len(keys)),
        "last_seen": date - rng.integers(0, 3, len(keys)),
        "admitted": count > 3,
    }


def test_a_vocabulary_part_holds_plain_string_dates_in_required_uncompressed_columns(tmp_path):
    rng = np.random.default_rng(1)
    vocab = vocab_columns(rng, 500)
    write_vocab_part(FS, str(tmp_path / "a.parquet"), vocab)  # dates as day numbers
    days = np.unique(np.r_[vocab["first_seen"], vocab["last_seen"]])[::-1]  # as indices into a dictionary
    indexed = {
        **vocab,
        "first_seen": np.searchsorted(-days, -vocab["first_seen"]).astype(np.int32),
        "last_seen": np.searchsorted(-days, -vocab["last_seen"]).astype(np.int32),
    }
    write_vocab_part(FS, str(tmp_path / "b.parquet"), indexed, days=days)
    a, b = pq.read_table(tmp_path / "a.parquet"), pq.read_table(tmp_path / "b.parquet")
    assert a.equals(b)
    assert a.schema.field("first_seen").type == pa.string() and not any(f.nullable for f in a.schema)
    assert a.column("last_seen").to_pylist() == day_dictionary(vocab["last_seen"]).cast(pa.string()).to_pylist()
    meta = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(0)
    columns = [meta.column(i) for i in range(meta.num_columns)]
    assert {c.compression for c in columns} == {"UNCOMPRESSED"}
    assert {c.path_in_schema for c in columns if c.is_stats_set} == {"field", "key"}


def test_a_bucket_is_read_from_parts_of_another_bucket_count_in_key_order(tmp_path):
    rng = np.random.default_rng(2)
    vocab = vocab_columns(rng, 2000)
    source = Bucketed(str(tmp_path / "vocab.parquet"), 3)
    FS.makedirs(source.path)
    of_source = bucket_of(vocab["key"], 3)
    for b in range(3):
        write_vocab_part(FS, source.part(b), {k: v[of_source == b] for k, v in vocab.items()})
    assert sorted(p.name for p in (tmp_path / "vocab.parquet").iterdir()) == [part_name(b) for b in range(3)]
    for buckets in (3, 5, 1):
        of_target = bucket_of(vocab["key"], buckets)
        for b in range(buckets):
            t = read_bucket(FS, source, b, buckets, ["key", "count", "first_seen"])
            assert t.column_names == ["key", "count", "first_seen"]
            np.testing.assert_array_equal(t.column("key").to_numpy(), vocab["key"][of_target == b])
            np.testing.assert_array_equal(t.column("count").to_numpy(), vocab["count"][of_target == b])
