"""Vocab tasks: an events partition is counted once into scratch counts that read back bucket by bucket."""

import numpy as np
import pandas as pd
from fsspec.implementations.local import LocalFileSystem

from pipeline.schema import CRITEO
from pipeline.vocab.buckets import bucket_of
from pipeline.vocab.counts import count_keys
from pipeline.vocab.parts import read_count_range
from pipeline.vocab.tasks import count_part

FS = LocalFileSystem()


def test_an_events_partitions_counts_read_back_bucket_by_bucket_sum_to_its_key_counts(tmp_path):
    rng = np.random.default_rng(0)
    events = pd.DataFrame(
        {name: rng.choice([f"v{i}" for i in range(300)] + [None], 5000) for name in CRITEO.categorical}
    )
    events.to_parquet(tmp_path / "part.parquet")
    distinct = count_part(
        str(tmp_path / "part.parquet"), str(tmp_path / "counts.parquet"), fs=FS, fields=list(CRITEO.categorical)
    )
    want = count_keys(events, list(CRITEO.categorical))
    assert distinct == len(want)
    parts = [read_count_range(FS, str(tmp_path / "counts.parquet"), b, 7) for b in range(7)]
    for b, (keys, _) in enumerate(parts):
        assert np.all(np.diff(keys) > 0) and np.all(bucket_of(keys, 7) == b)  # the bucket's keys, in key order
    np.testing.assert_array_equal(np.sort(np.concatenate([k for k, _ in parts])), want["key"].to_numpy())
    assert sum(int(c.sum()) for _, c in parts) == int(want["count"].sum())
