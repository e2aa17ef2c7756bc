"""The encode stage's pure row transform: events rows + the admitted keys -> the features the trainer reads.

`encode_frame` (docs/formats.md, "features"): label float32, d_i = log1p(max(x, 0)) with missing -> 0,
k_j = the value's key when admitted, else the field's OOV key, or its missing key; with `raw_keys`
(`encode.raw_keys`, the companion's input), r_j = the value's own key, admitted or not (the missing key
for a missing value).

Multi-valued fields (a list of values in one field, declared in a schema file): `k_j` holds the key of the
field's first value (missing key when the list is empty or null) so the trainer keeps one key column per
field, and an extra list<int64> column `bag_j` holds every value's key (admitted, else the field's OOV key).
The trainer pools each bag into field j's embedding row (`trainer.bags`; `model.bag_pooling`).

Used by the encode stage's tasks (`pipeline.encode.tasks`) and, on single rows, by serving
(`pipeline.encode.feature_spec`) and `ctrpipe evaluate`: one rule for training and scoring.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.encode import row_copies
from pipeline.encode.keys import factorize_keys, missing_key, oov_key
from pipeline.schema import LogSchema
from storage.features_manifest import bag_column, dense_column, key_column, raw_column


def dense_columns(schema: LogSchema) -> list[str]:
    """`d_<i>` for every dense input i (`storage.features_manifest.dense_column`)."""
    return [dense_column(i) for i in range(len(schema.dense))]


def key_columns(schema: LogSchema) -> list[str]:
    """`k_<j>` for every categorical field j (`storage.features_manifest.key_column`)."""
    return [key_column(j) for j in range(len(schema.categorical))]


def bag_columns(schema: LogSchema) -> list[str]:
    """`bag_<j>` for every multi-valued field j (list<int64> keys of all its values)."""
    multi = schema.multi_separator
    return [bag_column(j) for j, name in enumerate(schema.categorical) if name in multi]


def dense_transform(x: np.ndarray) -> np.ndarray:
    """d = log1p(max(x, 0)) of float32 values, missing (NaN) -> 0, as float32: the one dense rule of the encode
    stage and the scorer's small batches (`flows.serving.small`)."""
    return np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)).astype(np.float32)


def admit(keys: np.ndarray, admitted: np.ndarray, oov: np.ndarray | int) -> np.ndarray:
    """`keys` (int64) where they are among the sorted `admitted` keys, else `oov` (the field's OOV key, or an
    array of them broadcast against `keys`): the one OOV rule of the encode stage and the scorer's small batches."""
    if not len(admitted):
        return np.broadcast_to(np.asarray(oov, np.int64), keys.shape).copy()
    pos = np.minimum(np.searchsorted(admitted, keys), len(admitted) - 1)
    return np.where(admitted[pos] == keys, keys, oov).astype(np.int64)


def features_schema(schema: LogSchema, *, raw_keys: bool = False) -> pa.Schema:
    return pa.schema(
        [("label", pa.float32())]
        + [(c, pa.float32()) for c in dense_columns(schema)]
        + [(c, pa.int64()) for c in key_columns(schema)]
        + [(c, pa.list_(pa.int64())) for c in bag_columns(schema)]
        + ([(raw_column(j), pa.int64()) for j in range(len(schema.categorical))] if raw_keys else [])
    )


def encode_frame(
    events: pd.DataFrame, schema: LogSchema, admitted: np.ndarray, *, raw_keys: bool = False
) -> pd.DataFrame:
    """Features of `events` rows given the sorted admitted keys (see the module docstring)."""
    return encode_rows(events, schema, admitted, raw_keys=raw_keys)[0]


def encode_rows(
    events: pd.DataFrame, schema: LogSchema, admitted: np.ndarray, *, raw_keys: bool = False
) -> tuple[pd.DataFrame, np.ndarray]:
    """`encode_frame` and the rows' content hashes (`pipeline.encode.row_copies.row_hashes`, from the same keys)."""
    cols: dict[str, Any] = {"label": events["label"].to_numpy(np.float32)}  # arrays; a bag column: a list of them
    for i, name in enumerate(schema.dense):
        cols[dense_column(i)] = dense_transform(events[name].to_numpy(np.float32, na_value=np.nan))
    multi = schema.multi_separator
    raw: dict[int, np.ndarray] = {}
    for j, name in enumerate(schema.categorical):
        if name in multi:
            cols[key_column(j)], cols[bag_column(j)], cols[raw_column(j)] = _encode_bags(j, events[name], admitted)
            continue
        cols[key_column(j)], raw[j] = _encode_values(j, events[name], admitted)
        cols[raw_column(j)] = raw[j]
    out = pd.DataFrame({c: cols[c] for c in features_schema(schema, raw_keys=raw_keys).names})
    return out, row_copies.row_hashes(events, schema, raw)


def _encode_values(j: int, values, admitted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(keys of `values` of field j: admitted key, else the OOV key, else (missing) the missing key;
    the values' own keys, admitted or not)."""
    codes, keys = factorize_keys(j, values)
    present = codes >= 0
    own = np.full(len(codes), missing_key(j), dtype=np.int64)
    own[present] = keys[codes[present]]
    keys = admit(keys, admitted, oov_key(j))
    out = np.full(len(codes), missing_key(j), dtype=np.int64)
    out[present] = keys[codes[present]]
    return out, own


def _encode_bags(j: int, lists, admitted: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(first value's key per row, bag of keys per row, first value's own key per row) of a multi-valued field;
    empty values are dropped."""
    arr = pa.array(list(lists), type=pa.list_(pa.string())) if not isinstance(lists, pa.Array) else lists
    flat = pc.list_flatten(arr)
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    keys, own = _encode_values(j, flat.to_pandas(), admitted)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    keep = keys != missing_key(j)  # "" inside a list is not a value
    keys, own, row_of = keys[keep], own[keep], row_of[keep]
    bounds = np.searchsorted(row_of, np.arange(len(lengths) + 1))
    bags = [keys[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]
    first = np.full(len(lengths), missing_key(j), dtype=np.int64)
    first_own = first.copy()
    has = bounds[1:] > bounds[:-1]
    first[has] = keys[bounds[:-1][has]]
    first_own[has] = own[bounds[:-1][has]]
    return first, bags, first_own
