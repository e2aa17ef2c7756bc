"""Dask tasks of the encode stage: one events partition each (its timestamps, its eval rows' hashes, its
features parts), and the rewrite of an eval part without the copies of train rows."""

from __future__ import annotations

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.encode import row_copies
from pipeline.encode.frame import bag_columns, encode_rows, features_schema, key_columns
from pipeline.encode.split import train_mask
from pipeline.schema import LogSchema
from storage.io.fsio import join


def ts_counts(path: str, *, fs: fsspec.AbstractFileSystem) -> pd.Series:
    """Dask task: rows per timestamp of one events partition."""
    with fs.open(path, "rb") as f:
        ts = pq.read_table(f, columns=["ts"]).column("ts").to_numpy()
    return pd.Series(ts).value_counts(sort=False)


def orders_at(path: str, *, fs: fsspec.AbstractFileSystem, ts: int) -> np.ndarray:
    """Dask task: the `order` of one events partition's rows with timestamp `ts`."""
    with fs.open(path, "rb") as f:
        table = pq.read_table(f, columns=["ts", "order"])
    ts_col, order = table.column("ts").to_numpy(), table.column("order").to_numpy()
    return order[ts_col == ts]


def eval_hashes(path: str, rule: tuple, *, fs: fsspec.AbstractFileSystem, schema: LogSchema) -> np.ndarray:
    """Dask task: the content hashes of one events partition's eval rows, in row order."""
    with fs.open(path, "rb") as f:
        events = pq.read_table(f).to_pandas()
    evaluate = ~train_mask(events, rule)
    return row_copies.row_hashes(events[evaluate].reset_index(drop=True), schema)


def encode_part(
    path: str,
    index: int,
    rule: tuple,
    admitted: np.ndarray,
    eval_set: np.ndarray,
    *,
    fs: fsspec.AbstractFileSystem,
    schema: LogSchema,
    stage: str,
    sample_bits: int,
    raw_keys: bool = False,
) -> dict:
    """Dask task: encode one events partition, write its train/eval parts, count its train keys.

    Also returns the day's eval hashes its train rows copy (`copies`) and its sample of row hashes.
    """
    with fs.open(path, "rb") as f:
        events = pq.read_table(f).to_pandas()
    train = train_mask(events, rule)
    features, hashes = encode_rows(events, schema, admitted, raw_keys=raw_keys)
    name = f"part-{index:05d}.parquet"
    out_schema = features_schema(schema, raw_keys=raw_keys)
    for split, mask in (("train", train), ("eval", ~train)):
        if mask.any():
            table = pa.Table.from_pandas(features[mask], schema=out_schema, preserve_index=False)
            with fs.open(join(stage, split, name), "wb") as f:
                pq.write_table(table, f)
    keys = [features.loc[train, key_columns(schema)].to_numpy().ravel()]
    # the trainer pulls bag keys too; a bag's first key is also its k_j, so it counts twice (counts only rank keys)
    keys += [np.concatenate([np.empty(0, np.int64), *features.loc[train, c]]) for c in bag_columns(schema)]
    key_counts = pd.Series(np.concatenate(keys)).value_counts(sort=False)
    return {
        "name": name,
        "train": int(train.sum()),
        "eval": int((~train).sum()),
        "key_counts": key_counts,
        "copies": row_copies.copies_in(eval_set, hashes[train]),
        "sample": row_copies.sample(hashes, sample_bits),
    }


def drop_rows(path: str, drop: np.ndarray, *, fs: fsspec.AbstractFileSystem) -> int:
    """Dask task: rewrite one features part without the rows `drop` marks (removed when none is left)."""
    with fs.open(path, "rb") as f:
        table = pq.read_table(f)
    if len(drop) != table.num_rows:
        raise RuntimeError(f"{path}: {table.num_rows} rows, but {len(drop)} eval hashes; encode it again")
    kept = table.filter(pa.array(~drop))
    if kept.num_rows:
        with fs.open(path, "wb") as f:
            pq.write_table(kept, f)
    else:
        fs.rm(path)
    return int(drop.sum())
