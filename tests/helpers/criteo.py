"""A committed features directory built from a real Criteo sample (read-only use of `pipeline`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.encode.frame import dense_columns, encode_frame, key_columns
from pipeline.encode.keys import feature_keys
from pipeline.ingest.parse import read_log_file
from pipeline.schema import get_schema


def write_criteo_features(tsv: Path, root: Path, *, eval_rows: int = 1000, parts: int = 2) -> Path:
    """Parse `tsv`, admit every key seen twice, encode, and commit `root/{train,eval}/part-*.parquet`."""
    schema = get_schema("criteo")
    events, _ = read_log_file(str(tsv), "criteo")
    keys = np.concatenate([feature_keys(j, events[c]) for j, c in enumerate(schema.categorical)])
    uniq, counts = np.unique(keys, return_counts=True)
    features = encode_frame(events, schema, uniq[counts >= 2])
    n_train = len(features) - eval_rows
    for split, frame, n_parts in (("train", features.iloc[:n_train], parts), ("eval", features.iloc[n_train:], 1)):
        (root / split).mkdir(parents=True)
        for i, idx in enumerate(np.array_split(np.arange(len(frame)), n_parts)):
            table = pa.Table.from_pandas(frame.iloc[idx], preserve_index=False)
            pq.write_table(table, root / split / f"part-{i:05d}.parquet", row_group_size=1000)
    manifest = {
        "rows_train": n_train,
        "rows_eval": eval_rows,
        "format": "parquet",
        "vocab_date": "2024-01-01",
        "dense_columns": dense_columns(schema),
        "key_columns": key_columns(schema),
        "fields": list(schema.categorical),
    }
    (root / "_SUCCESS.json").write_text(json.dumps(manifest))
    return root
