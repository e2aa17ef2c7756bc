"""Encode stage: events + vocabulary of D -> features/date=D/{train,eval}/ for the trainer.

`encode_frame` is the pure row transform (docs/ARCHITECTURE.md, "features"):
label float32, d_i = log1p(max(x, 0)) with missing -> 0, k_j = the value's key
when admitted, else the field's OOV key, or its missing key; with `raw_keys`
(`encode.raw_keys`, the companion's input), r_j = the value's own key, admitted
or not (the missing key for a missing value).

The day is split in time order: the first (1 - eval_fraction) of the rows
train, the rest evaluate, less the eval rows that exactly copy a train row of
the day (`pipeline.encode.row_copies`: a replayed export must not put training rows
into the hold-out).  The eval rows' hashes are computed first (only the
partitions holding eval rows are read for it), each encode task reports the
ones its train rows copy, and the eval parts holding such copies are
rewritten without them.  Time order is `order` for formats without a
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
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from distributed import Client

from pipeline.cluster import gather
from pipeline.config import EncodeConfig
from pipeline.encode import row_copies
from pipeline.encode.keys import factorize_keys, missing_key, oov_key
from pipeline.schema import LogSchema, get_schema
from pipeline.vocab.manifest import read_vocab_manifest
from pipeline.vocab.stage import load_admitted
from storage.features_manifest import (
    Duplicates,
    FeaturesManifest,
    PartRows,
    bag_column,
    dense_column,
    key_column,
    raw_column,
    read_features_manifest,
)
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
    duplicate_share: float = 0.0
    """Share of the day's rows that copy another row exactly (`pipeline.encode.row_copies`)."""
    eval_copies_dropped: int = 0
    """Eval rows left out because a train row of the day is their exact copy."""

    def summary(self) -> str:
        done = " (already committed)" if self.skipped else ""
        copies = f", {self.eval_copies_dropped} eval copies of train rows dropped" if self.eval_copies_dropped else ""
        return f"encode {self.date}: {self.rows_train} train rows, {self.rows_eval} eval rows{copies}{done}"


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
        x = events[name].to_numpy(np.float32, na_value=np.nan)
        cols[dense_column(i)] = np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)).astype(np.float32)
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
    if len(admitted):
        pos = np.minimum(np.searchsorted(admitted, keys), len(admitted) - 1)
        keys = np.where(admitted[pos] == keys, keys, oov_key(j))
    else:
        keys = np.full(len(keys), oov_key(j), dtype=np.int64)
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
    vocab = read_vocab_manifest(fs, layout.fs(layout.vocab(date))[1])
    if vocab is None:
        raise FileNotFoundError(f"no committed vocabulary for {date} at {layout.vocab(date)}: run build_vocab first")
    _, final = layout.fs(layout.features(date))
    done = read_features_manifest(fs, final)
    raw_keys = encode.raw_keys_for(events["rows_written"])
    # the manifest's own rule says what a committed day was made from (one rule, so a rerun compares like with like)
    source = FeaturesManifest(
        events_run_id=events.get("run_id"),
        vocab_run_id=vocab.run_id,
        eval_fraction=encode.eval_fraction,
        raw_keys=raw_keys,
    ).source
    if done and not force and done.source == source:
        return _result(done, skipped=True, url=done.data_dir(layout.features(date)))

    paths = [join(data_dir(events_dir, events), p["name"]) for p in events["parts"]]
    part_rows = [p["rows"] for p in events["parts"]]
    rows_eval = eval_size(events["rows_written"], encode.eval_fraction)
    rows_train = events["rows_written"] - rows_eval
    rules: list[tuple[Any, ...]]  # ("head", k) or ("threshold", t, order)
    if schema.timestamp is None:
        rules = [("head", k) for k in positional_split(part_rows, rows_train)]
        holds_eval = [k < n for k, n in zip((r[1] for r in rules), part_rows, strict=True)]
    else:
        per_part = gather(client, client.map(_ts_counts, paths, fs=fs, pure=False), what=f"encode {date}: timestamps")
        t, k = ts_threshold(pd.concat(per_part), rows_train)
        orders = np.sort(
            np.concatenate(
                gather(
                    client,
                    client.map(_orders_at, paths, fs=fs, ts=t, pure=False),
                    what=f"encode {date}: the split's rows",
                )
            )
        )
        rules = [("threshold", t, int(orders[k - 1]) if k else -1)] * len(paths)
        holds_eval = [bool(len(c)) and int(c.index.max()) >= t for c in per_part]

    # the eval rows' hashes first, so the encode tasks can say which of them are copies of train rows
    eval_at = [i for i, h in enumerate(holds_eval) if h]
    eval_hashes = dict(
        zip(
            eval_at,
            gather(
                client,
                client.map(
                    _eval_hashes,
                    [paths[i] for i in eval_at],
                    [rules[i] for i in eval_at],
                    fs=fs,
                    schema=schema,
                    pure=False,
                ),
                what=f"encode {date}: eval row hashes",
            ),
            strict=True,
        )
    )
    all_eval = np.unique(np.concatenate([np.empty(0, np.uint64), *eval_hashes.values()]))
    bits = row_copies.sample_bits(events["rows_written"])
    admitted = client.scatter(load_admitted(layout, date), broadcast=True)
    eval_set = client.scatter(all_eval, broadcast=True)
    with staged(fs, final) as stage:
        for split in ("train", "eval"):
            fs.makedirs(join(stage, split), exist_ok=True)
        futures = [
            client.submit(
                _encode_part,
                path,
                i,
                rule,
                admitted,
                eval_set,
                fs=fs,
                schema=schema,
                stage=stage,
                sample_bits=bits,
                raw_keys=raw_keys,
                pure=False,
            )
            for i, (path, rule) in enumerate(zip(paths, rules, strict=True))
        ]
        done_parts = gather(client, futures, what=f"encode {date}: parts")
        n_train = sum(p["train"] for p in done_parts)
        n_eval = sum(p["eval"] for p in done_parts)
        if (n_train, n_eval) != (rows_train, rows_eval):  # the split rules must hit the planned sizes
            raise RuntimeError(f"encode {date}: split gave {n_train}/{n_eval} rows, planned {rows_train}/{rows_eval}")
        copies = np.unique(np.concatenate([np.empty(0, np.uint64), *(p["copies"] for p in done_parts)]))
        dropped = _drop_eval_copies(client, done_parts, eval_hashes, copies, fs=fs, stage=stage)
        rows_eval -= sum(dropped.values())
        for p in done_parts:
            p["eval"] -= dropped.get(p["name"], 0)
        key_counts = _merge_key_counts([p["key_counts"] for p in done_parts])
        with fs.open(join(stage, "key_counts.parquet"), "wb") as f:
            pq.write_table(pa.Table.from_pandas(key_counts, preserve_index=False), f)
        sampled = np.concatenate([np.empty(0, np.uint64), *(p["sample"] for p in done_parts)])
        manifest = FeaturesManifest(
            date=date,
            format=schema.name,
            rows_train=rows_train,
            rows_eval=rows_eval,
            eval_copies_dropped=sum(dropped.values()),
            duplicates=Duplicates(
                share=round(row_copies.duplicate_share(sampled), 6), sampled_rows=len(sampled), sample_bits=bits
            ),
            dense_columns=tuple(dense_columns(schema)),
            key_columns=tuple(key_columns(schema)),
            fields=tuple(schema.categorical),
            dense_fields=tuple(schema.dense),
            vocab_date=date,
            bag_columns=tuple(bag_columns(schema)),
            train_parts=tuple(p["name"] for p in done_parts if p["train"]),
            eval_parts=tuple(p["name"] for p in done_parts if p["eval"]),
            train_part_rows=tuple(PartRows(p["name"], p["train"]) for p in done_parts if p["train"]),
            eval_part_rows=tuple(PartRows(p["name"], p["eval"]) for p in done_parts if p["eval"]),
            distinct_train_keys=len(key_counts),
            events_run_id=events.get("run_id"),
            vocab_run_id=vocab.run_id,
            eval_fraction=encode.eval_fraction,
            raw_keys=raw_keys,
            run_id=uuid.uuid4().hex,
            code_version=code_version(),
        )
        commit_dir(fs, stage, final, manifest.to_dict())
    return _result(manifest, skipped=False, url=committed_data_url(layout.features(date), fs, stage))


def _result(manifest: FeaturesManifest, *, skipped: bool, url: str) -> EncodeResult:
    return EncodeResult(
        date=str(manifest.date),
        rows_train=manifest.rows_train,
        rows_eval=manifest.rows_eval,
        skipped=skipped,
        run_id=manifest.run_id,
        url=url,
        duplicate_share=manifest.duplicates.share,
        eval_copies_dropped=manifest.eval_copies_dropped,
    )


def _drop_eval_copies(
    client: Client,
    parts: list[dict],
    eval_hashes: dict[int, np.ndarray],
    copies: np.ndarray,
    *,
    fs: fsspec.AbstractFileSystem,
    stage: str,
) -> dict[str, int]:
    """Rewrite the eval parts holding copies of train rows without them; part name -> rows dropped."""
    if not len(copies):
        return {}
    jobs = []
    for i, hashes in eval_hashes.items():
        drop = np.isin(hashes, copies)
        if drop.any():
            jobs.append((parts[i]["name"], drop))
    done = gather(
        client,
        [client.submit(_drop_rows, join(stage, "eval", name), drop, fs=fs, pure=False) for name, drop in jobs],
        what="encode: dropping eval copies of train rows",
    )
    return {name: n for (name, _), n in zip(jobs, done, strict=True)}


def _drop_rows(path: str, drop: np.ndarray, *, fs: fsspec.AbstractFileSystem) -> int:
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


def _train_mask(events: pd.DataFrame, rule: tuple) -> np.ndarray:
    """Which rows of an events partition train (the rest evaluate), by the split rule of `encode_date`."""
    if rule[0] == "head":
        return np.arange(len(events)) < rule[1]
    _, t, last_order = rule
    ts, order = events["ts"].to_numpy(np.int64), events["order"].to_numpy(np.int64)
    return (ts < t) | ((ts == t) & (order <= last_order))


def _eval_hashes(path: str, rule: tuple, *, fs: fsspec.AbstractFileSystem, schema: LogSchema) -> np.ndarray:
    """Dask task: the content hashes of one events partition's eval rows, in row order."""
    with fs.open(path, "rb") as f:
        events = pq.read_table(f).to_pandas()
    evaluate = ~_train_mask(events, rule)
    return row_copies.row_hashes(events[evaluate].reset_index(drop=True), schema)


def _encode_part(
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
    train = _train_mask(events, rule)
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
