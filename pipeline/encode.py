"""Encode stage: events + vocabulary of D -> features/date=D/{train,eval}/ for the trainer.

`encode_frame` is the pure row transform (docs/ARCHITECTURE.md, "features"):
label float32, d_i = log1p(max(x, 0)) with missing -> 0, k_j = the value's key
when admitted, else the field's OOV key, or its missing key.

The day is split in time order: the first (1 - eval_fraction) of the rows
train, the rest evaluate.  Time order is `order` for formats without a
timestamp, and (`ts`, `order`) for Avazu, whose rows are only roughly sorted
by hour; the split point is found exactly from per-partition counts, so no
process sorts the day.  Parts keep the events partition's index:
train/part-00003.parquet and eval/part-00003.parquet hold the train and eval
rows of events partition 3, in file order.

Multi-valued fields (a list of values in one field, declared in a schema
file): `k_j` holds the key of the field's first value (missing key when the
list is empty or null) so the trainer keeps one key column per field, and an
extra list<int64> column `bag_j` holds every value's key (admitted, else the
field's OOV key).  The trainer pools each bag into field j's embedding row
(`trainer.bags`; `model.bag_pooling`), so key_counts.parquet, the warm
stage's working set, counts the bag keys too.

Sharing among R trainer ranks without a coordinator: the manifest lists
`train_part_rows` / `eval_part_rows` ([{name, rows}] in order), from which
each rank computes its own contiguous block (`trainer.data.rank_share`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from distributed import Client

from pipeline.config import EncodeConfig
from pipeline.keys import factorize_keys, missing_key, oov_key
from pipeline.schema import LogSchema, get_schema
from pipeline.vocab_stage import load_admitted
from storage.io.dates import validate_date
from storage.io.fsio import (
    commit_dir,
    committed_data_url,
    data_dir,
    join,
    read_manifest,
    staged,
)
from storage.io.layout import Layout
from storage.io.version import code_version


@dataclass(frozen=True, slots=True)
class EncodeResult:
    date: str
    rows_train: int
    rows_eval: int
    skipped: bool
    run_id: str = ""
    """The committed features' run id (what identifies their content)."""
    url: str = ""
    """The files of the committed `features/date=D` (`storage.io.fsio.data_url`)."""

    def summary(self) -> str:
        done = " (already committed)" if self.skipped else ""
        return f"encode {self.date}: {self.rows_train} train rows, {self.rows_eval} eval rows{done}"


def dense_columns(schema: LogSchema) -> list[str]:
    return [f"d_{i}" for i in range(len(schema.dense))]


def key_columns(schema: LogSchema) -> list[str]:
    return [f"k_{j}" for j in range(len(schema.categorical))]


def bag_columns(schema: LogSchema) -> list[str]:
    """`bag_<j>` for every multi-valued field j (list<int64> keys of all its values)."""
    multi = schema.multi_separator
    return [f"bag_{j}" for j, name in enumerate(schema.categorical) if name in multi]


def features_schema(schema: LogSchema) -> pa.Schema:
    return pa.schema(
        [("label", pa.float32())]
        + [(c, pa.float32()) for c in dense_columns(schema)]
        + [(c, pa.int64()) for c in key_columns(schema)]
        + [(c, pa.list_(pa.int64())) for c in bag_columns(schema)]
    )


def encode_frame(events: pd.DataFrame, schema: LogSchema, admitted: np.ndarray) -> pd.DataFrame:
    """Features of `events` rows given the sorted admitted keys (see the module docstring)."""
    cols: dict[str, np.ndarray] = {"label": events["label"].to_numpy(np.float32)}
    for i, name in enumerate(schema.dense):
        x = events[name].to_numpy(np.float32, na_value=np.nan)
        cols[f"d_{i}"] = np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)).astype(np.float32)
    multi = schema.multi_separator
    for j, name in enumerate(schema.categorical):
        if name in multi:
            cols[f"k_{j}"], cols[f"bag_{j}"] = _encode_bags(j, events[name], admitted)
            continue
        cols[f"k_{j}"] = _encode_values(j, events[name], admitted)
    out = pd.DataFrame({c: cols[c] for c in features_schema(schema).names})
    return out


def _encode_values(j: int, values, admitted: np.ndarray) -> np.ndarray:
    """Keys of `values` of field j: admitted key, else the OOV key, else (missing) the missing key."""
    codes, keys = factorize_keys(j, values)
    if len(admitted):
        pos = np.minimum(np.searchsorted(admitted, keys), len(admitted) - 1)
        keys = np.where(admitted[pos] == keys, keys, oov_key(j))
    else:
        keys = np.full(len(keys), oov_key(j), dtype=np.int64)
    out = np.full(len(codes), missing_key(j), dtype=np.int64)
    present = codes >= 0
    out[present] = keys[codes[present]]
    return out


def _encode_bags(j: int, lists, admitted: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """(first value's key per row, bag of keys per row) of a multi-valued field; empty values are dropped."""
    arr = pa.array(list(lists), type=pa.list_(pa.string())) if not isinstance(lists, pa.Array) else lists
    flat = pc.list_flatten(arr)
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    keys = _encode_values(j, flat.to_pandas(), admitted)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    keep = keys != missing_key(j)  # "" inside a list is not a value
    keys, row_of = keys[keep], row_of[keep]
    bounds = np.searchsorted(row_of, np.arange(len(lengths) + 1))
    bags = [keys[bounds[i] : bounds[i + 1]] for i in range(len(lengths))]
    first = np.full(len(lengths), missing_key(j), dtype=np.int64)
    has = bounds[1:] > bounds[:-1]
    first[has] = keys[bounds[:-1][has]]
    return first, bags


def eval_size(rows: int, eval_fraction: float) -> int:
    """Rows held out: round(rows * eval_fraction), at least 1 and leaving at least 1 to train."""
    if rows < 2:
        raise ValueError(f"cannot split {rows} rows into train and eval; the day needs at least 2 rows")
    return min(max(round(rows * eval_fraction), 1), rows - 1)


def positional_split(part_rows: list[int], rows_train: int) -> list[int]:
    """Train rows at the head of each partition when partitions are in time order."""
    starts = np.concatenate([[0], np.cumsum(part_rows)[:-1]]).astype(np.int64)
    return np.clip(rows_train - starts, 0, np.asarray(part_rows, dtype=np.int64)).tolist()


def ts_threshold(ts_counts: pd.Series, rows_train: int) -> tuple[int, int]:
    """(t, k): train = rows with ts < t, plus the k rows with ts == t of smallest `order`.

    Args:
        ts_counts: rows per timestamp over the day, indexed by ts.
        rows_train: rows to put in train.
    """
    counts = ts_counts.groupby(level=0).sum().sort_index()
    cum = counts.cumsum().to_numpy()
    i = int(np.searchsorted(cum, rows_train))
    before = int(cum[i - 1]) if i else 0
    return int(counts.index[i]), rows_train - before


def encode_date(
    date: str,
    *,
    layout: Layout,
    encode: EncodeConfig,
    fmt: str | LogSchema,
    client: Client,
    force: bool = False,
) -> EncodeResult:
    """Encode the committed events of `date` with its vocabulary into `features/date=D/` (`Layout`).

    Also writes features/date=D/key_counts.parquet: (key, count) of the train
    rows (every `k_j` and every bag key), hottest first, the working set the
    warm stage loads.

    Raises:
        FileNotFoundError: the events or the vocabulary of `date` are not committed.
    """
    validate_date(date)
    schema = get_schema(fmt)
    fs, events_dir = layout.fs(layout.events(date))
    events = read_manifest(fs, events_dir)
    if events is None:
        raise FileNotFoundError(f"no committed events for {date} at {layout.events(date)}: run ingest first")
    vocab = read_manifest(fs, layout.fs(layout.vocab(date))[1])
    if vocab is None:
        raise FileNotFoundError(f"no committed vocabulary for {date} at {layout.vocab(date)}: run build_vocab first")
    _, final = layout.fs(layout.features(date))
    done = read_manifest(fs, final)
    source = {"events_run_id": events.get("run_id"), "vocab_run_id": vocab.get("run_id"), "eval_fraction": encode.eval_fraction}
    if done and not force and all(done.get(k) == v for k, v in source.items()):
        return EncodeResult(date=date, rows_train=done["rows_train"], rows_eval=done["rows_eval"], skipped=True,
                            run_id=done["run_id"], url=data_dir(layout.features(date), done))

    paths = [join(data_dir(events_dir, events), p["name"]) for p in events["parts"]]
    rows_eval = eval_size(events["rows_written"], encode.eval_fraction)
    rows_train = events["rows_written"] - rows_eval
    if schema.timestamp is None:
        rules = [("head", k) for k in positional_split([p["rows"] for p in events["parts"]], rows_train)]
    else:
        ts_counts = pd.concat(client.gather(client.map(_ts_counts, paths, fs=fs, pure=False)))
        t, k = ts_threshold(ts_counts, rows_train)
        orders = np.sort(np.concatenate(client.gather(client.map(_orders_at, paths, fs=fs, ts=t, pure=False))))
        rules = [("threshold", t, int(orders[k - 1]) if k else -1)] * len(paths)

    admitted = client.scatter(load_admitted(layout, date), broadcast=True)
    with staged(fs, final) as stage:
        for split in ("train", "eval"):
            fs.makedirs(join(stage, split), exist_ok=True)
        futures = [
            client.submit(_encode_part, path, i, rule, admitted, fs=fs, schema=schema, stage=stage, pure=False)
            for i, (path, rule) in enumerate(zip(paths, rules, strict=True))
        ]
        done_parts = client.gather(futures)
        n_train = sum(p["train"] for p in done_parts)
        n_eval = sum(p["eval"] for p in done_parts)
        if (n_train, n_eval) != (rows_train, rows_eval):  # the split rules must hit the planned sizes
            raise RuntimeError(f"encode {date}: split gave {n_train}/{n_eval} rows, planned {rows_train}/{rows_eval}")
        key_counts = _merge_key_counts([p["key_counts"] for p in done_parts])
        with fs.open(join(stage, "key_counts.parquet"), "wb") as f:
            pq.write_table(pa.Table.from_pandas(key_counts, preserve_index=False), f)
        manifest = {
            "date": date,
            "format": schema.name,
            "rows_train": rows_train,
            "rows_eval": rows_eval,
            "dense_columns": dense_columns(schema),
            "key_columns": key_columns(schema),
            "fields": list(schema.categorical),
            "dense_fields": list(schema.dense),
            "vocab_date": date,
            "bag_columns": bag_columns(schema),
            "train_parts": [p["name"] for p in done_parts if p["train"]],
            "eval_parts": [p["name"] for p in done_parts if p["eval"]],
            "train_part_rows": [{"name": p["name"], "rows": p["train"]} for p in done_parts if p["train"]],
            "eval_part_rows": [{"name": p["name"], "rows": p["eval"]} for p in done_parts if p["eval"]],
            "distinct_train_keys": len(key_counts),
            **source,
            "run_id": uuid.uuid4().hex,
            "code_version": code_version(),
        }
        commit_dir(fs, stage, final, manifest)
    return EncodeResult(date=date, rows_train=rows_train, rows_eval=rows_eval, skipped=False,
                        run_id=manifest["run_id"], url=committed_data_url(layout.features(date), fs, stage))


def _encode_part(
    path: str, index: int, rule: tuple, admitted: np.ndarray, *, fs: fsspec.AbstractFileSystem, schema: LogSchema,
    stage: str,
) -> dict:
    """Dask task: encode one events partition, write its train/eval parts, count its train keys."""
    with fs.open(path, "rb") as f:
        events = pq.read_table(f).to_pandas()
    if rule[0] == "head":
        train = np.arange(len(events)) < rule[1]
    else:
        _, t, last_order = rule
        ts, order = events["ts"].to_numpy(np.int64), events["order"].to_numpy(np.int64)
        train = (ts < t) | ((ts == t) & (order <= last_order))
    features = encode_frame(events, schema, admitted)
    name = f"part-{index:05d}.parquet"
    out_schema = features_schema(schema)
    for split, mask in (("train", train), ("eval", ~train)):
        if mask.any():
            table = pa.Table.from_pandas(features[mask], schema=out_schema, preserve_index=False)
            with fs.open(join(stage, split, name), "wb") as f:
                pq.write_table(table, f)
    keys = [features.loc[train, key_columns(schema)].to_numpy().ravel()]
    # the trainer pulls bag keys too; a bag's first key is also its k_j, so it counts twice (counts only rank keys)
    keys += [np.concatenate([np.empty(0, np.int64), *features.loc[train, c]]) for c in bag_columns(schema)]
    key_counts = pd.Series(np.concatenate(keys)).value_counts(sort=False)
    return {"name": name, "train": int(train.sum()), "eval": int((~train).sum()), "key_counts": key_counts}


def _merge_key_counts(parts: list[pd.Series]) -> pd.DataFrame:
    """(key, count) summed over parts, sorted by count desc then key (deterministic)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({"key": np.empty(0, np.int64), "count": np.empty(0, np.int64)})
    total = pd.concat(parts).groupby(level=0).sum()
    frame = pd.DataFrame({"key": total.index.to_numpy(np.int64), "count": total.to_numpy(np.int64)})
    return frame.sort_values(["count", "key"], ascending=[False, True], ignore_index=True)


def _ts_counts(path: str, *, fs: fsspec.AbstractFileSystem) -> pd.Series:
    with fs.open(path, "rb") as f:
        ts = pq.read_table(f, columns=["ts"]).column("ts").to_numpy()
    return pd.Series(ts).value_counts(sort=False)


def _orders_at(path: str, *, fs: fsspec.AbstractFileSystem, ts: int) -> np.ndarray:
    with fs.open(path, "rb") as f:
        table = pq.read_table(f, columns=["ts", "order"])
    ts_col, order = table.column("ts").to_numpy(), table.column("order").to_numpy()
    return order[ts_col == ts]
