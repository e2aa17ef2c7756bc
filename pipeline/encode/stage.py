"""Encode stage: events + vocabulary of D -> features/date=D/{train,eval}/ for the trainer.

Wiring only: the rows are encoded by `pipeline.encode.frame` (the pure row transform), split in time order
by `pipeline.encode.split`, in the Dask tasks of `pipeline.encode.tasks`; this module plans them and
commits the directory with its manifest (`storage.features_manifest`).

The day is split in time order: the first (1 - eval_fraction) of the rows
train, the rest evaluate, less the eval rows that exactly copy a train row of
the day (`pipeline.encode.row_copies`: a replayed export must not put training rows
into the hold-out).  The eval rows' hashes are computed first (only the
partitions holding eval rows are read for it), each encode task reports the
ones its train rows copy, and the eval parts holding such copies are
rewritten without them.  Parts keep the events partition's index:
train/part-00003.parquet and eval/part-00003.parquet hold the train and eval
rows of events partition 3, in file order.

key_counts.parquet, the warm stage's working set, counts the train rows' keys, the bag keys of
multi-valued fields too (the trainer pools each bag into its field's embedding row).

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
import pyarrow.parquet as pq
from distributed import Client

from pipeline.cluster import gather
from pipeline.config import EncodeConfig
from pipeline.encode import row_copies
from pipeline.encode.frame import bag_columns, dense_columns, key_columns
from pipeline.encode.split import eval_size, positional_split, ts_threshold
from pipeline.encode.tasks import drop_rows, encode_part, eval_hashes, orders_at, ts_counts
from pipeline.ingest.manifest import EventsManifest, committed_events
from pipeline.schema import LogSchema, get_schema
from pipeline.vocab.manifest import VocabManifest, read_vocab_manifest
from pipeline.vocab.stage import load_admitted
from storage.features_manifest import (
    Duplicates,
    FeaturesManifest,
    PartRows,
    read_features_manifest,
)
from storage.io.dates import validate_date
from storage.io.fsio import commit_dir, committed_data_url, join, staged
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
    fs, events_dir, events = committed_events(layout, date)
    vocab = read_vocab_manifest(fs, layout.fs(layout.vocab(date))[1])
    if vocab is None:
        raise FileNotFoundError(f"no committed vocabulary for {date} at {layout.vocab(date)}: run build_vocab first")
    _, final = layout.fs(layout.features(date))
    done = read_features_manifest(fs, final)
    raw_keys = encode.raw_keys_for(events.rows_written)
    # the manifest's own rule says what a committed day was made from (one rule, so a rerun compares like with like)
    source = FeaturesManifest(
        events_run_id=events.run_id,
        vocab_run_id=vocab.run_id,
        eval_fraction=encode.eval_fraction,
        raw_keys=raw_keys,
    ).source
    if done and not force and done.source == source:
        return _result(done, skipped=True, url=done.data_dir(layout.features(date)))

    paths = events.part_urls(events_dir)
    rows_eval = eval_size(events.rows_written, encode.eval_fraction)
    rows_train = events.rows_written - rows_eval
    rules, holds_eval = _split_rules(
        client, paths, [p.rows for p in events.parts], rows_train, fs=fs, date=date, schema=schema
    )
    hashes = _eval_row_hashes(client, paths, rules, holds_eval, fs=fs, date=date, schema=schema)
    bits = row_copies.sample_bits(events.rows_written)
    with staged(fs, final) as stage:
        parts = _encode_parts(
            client,
            paths,
            rules,
            hashes,
            admitted=load_admitted(layout, date),
            date=date,
            fs=fs,
            schema=schema,
            stage=stage,
            sample_bits=bits,
            raw_keys=raw_keys,
        )
        n_train, n_eval = sum(p["train"] for p in parts), sum(p["eval"] for p in parts)
        if (n_train, n_eval) != (rows_train, rows_eval):  # the split rules must hit the planned sizes
            raise RuntimeError(f"encode {date}: split gave {n_train}/{n_eval} rows, planned {rows_train}/{rows_eval}")
        dropped = _drop_eval_copies(client, parts, hashes, fs=fs, stage=stage)
        key_counts = _merge_key_counts([p["key_counts"] for p in parts])
        with fs.open(join(stage, "key_counts.parquet"), "wb") as f:
            pq.write_table(pa.Table.from_pandas(key_counts, preserve_index=False), f)
        manifest = _manifest(
            date,
            schema,
            encode,
            events=events,
            vocab=vocab,
            parts=parts,
            dropped=dropped,
            sample_bits=bits,
            distinct_train_keys=len(key_counts),
            raw_keys=raw_keys,
        )
        commit_dir(fs, stage, final, manifest.to_dict())
    return _result(manifest, skipped=False, url=committed_data_url(layout.features(date), fs, stage))


def _split_rules(
    client: Client,
    paths: list[str],
    part_rows: list[int],
    rows_train: int,
    *,
    fs: fsspec.AbstractFileSystem,
    date: str,
    schema: LogSchema,
) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """(each events partition's split rule, whether it holds eval rows) for `rows_train` rows in time order.

    Rules: ("head", k) by position without a timestamp, else ("threshold", t, order) from the day's
    rows per timestamp (`pipeline.encode.split`).
    """
    if schema.timestamp is None:
        heads = positional_split(part_rows, rows_train)
        return [("head", k) for k in heads], [k < n for k, n in zip(heads, part_rows, strict=True)]
    per_part = gather(client, client.map(ts_counts, paths, fs=fs, pure=False), what=f"encode {date}: timestamps")
    t, k = ts_threshold(pd.concat(per_part), rows_train)
    orders = np.sort(
        np.concatenate(
            gather(
                client,
                client.map(orders_at, paths, fs=fs, ts=t, pure=False),
                what=f"encode {date}: the split's rows",
            )
        )
    )
    rules: list[tuple[Any, ...]] = [("threshold", t, int(orders[k - 1]) if k else -1)] * len(paths)
    return rules, [bool(len(c)) and int(c.index.max()) >= t for c in per_part]


def _eval_row_hashes(
    client: Client,
    paths: list[str],
    rules: list[tuple[Any, ...]],
    holds_eval: list[bool],
    *,
    fs: fsspec.AbstractFileSystem,
    date: str,
    schema: LogSchema,
) -> dict[int, np.ndarray]:
    """Partition index -> the content hashes of its eval rows, for the partitions holding eval rows.

    Computed first, so the encode tasks can say which of them are copies of train rows.
    """
    eval_at = [i for i, h in enumerate(holds_eval) if h]
    futures = client.map(
        eval_hashes, [paths[i] for i in eval_at], [rules[i] for i in eval_at], fs=fs, schema=schema, pure=False
    )
    return dict(zip(eval_at, gather(client, futures, what=f"encode {date}: eval row hashes"), strict=True))


def _encode_parts(
    client: Client,
    paths: list[str],
    rules: list[tuple[Any, ...]],
    hashes: dict[int, np.ndarray],
    *,
    admitted: np.ndarray,
    date: str,
    fs: fsspec.AbstractFileSystem,
    schema: LogSchema,
    stage: str,
    sample_bits: int,
    raw_keys: bool,
) -> list[dict]:
    """One `encode_part` task per events partition into `stage`'s train/ and eval/; their results in order.

    Args:
        hashes: the eval rows' hashes (`_eval_row_hashes`): each task reports those its train rows copy.
        admitted: the vocabulary's sorted admitted keys (sent to every worker once).
    """
    all_eval = np.unique(np.concatenate([np.empty(0, np.uint64), *hashes.values()]))
    admitted = client.scatter(admitted, broadcast=True)
    eval_set = client.scatter(all_eval, broadcast=True)
    for split in ("train", "eval"):
        fs.makedirs(join(stage, split), exist_ok=True)
    futures = [
        client.submit(
            encode_part,
            path,
            i,
            rule,
            admitted,
            eval_set,
            fs=fs,
            schema=schema,
            stage=stage,
            sample_bits=sample_bits,
            raw_keys=raw_keys,
            pure=False,
        )
        for i, (path, rule) in enumerate(zip(paths, rules, strict=True))
    ]
    return gather(client, futures, what=f"encode {date}: parts")


def _manifest(
    date: str,
    schema: LogSchema,
    encode: EncodeConfig,
    *,
    events: EventsManifest,
    vocab: VocabManifest,
    parts: list[dict],
    dropped: int,
    sample_bits: int,
    distinct_train_keys: int,
    raw_keys: bool,
) -> FeaturesManifest:
    """The features manifest of the encoded `parts` (their eval rows less the `dropped` copies)."""
    sampled = np.concatenate([np.empty(0, np.uint64), *(p["sample"] for p in parts)])
    return FeaturesManifest(
        date=date,
        format=schema.name,
        rows_train=sum(p["train"] for p in parts),
        rows_eval=sum(p["eval"] for p in parts),
        eval_copies_dropped=dropped,
        duplicates=Duplicates(
            share=round(row_copies.duplicate_share(sampled), 6), sampled_rows=len(sampled), sample_bits=sample_bits
        ),
        dense_columns=tuple(dense_columns(schema)),
        key_columns=tuple(key_columns(schema)),
        fields=tuple(schema.categorical),
        dense_fields=tuple(schema.dense),
        vocab_date=date,
        bag_columns=tuple(bag_columns(schema)),
        train_parts=tuple(p["name"] for p in parts if p["train"]),
        eval_parts=tuple(p["name"] for p in parts if p["eval"]),
        train_part_rows=tuple(PartRows(p["name"], p["train"]) for p in parts if p["train"]),
        eval_part_rows=tuple(PartRows(p["name"], p["eval"]) for p in parts if p["eval"]),
        distinct_train_keys=distinct_train_keys,
        events_run_id=events.run_id,
        vocab_run_id=vocab.run_id,
        eval_fraction=encode.eval_fraction,
        raw_keys=raw_keys,
        run_id=uuid.uuid4().hex,
        code_version=code_version(),
    )


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
    *,
    fs: fsspec.AbstractFileSystem,
    stage: str,
) -> int:
    """Rewrite the eval parts holding copies of train rows without them (each part's `eval` count less
    them); the rows dropped."""
    copies = np.unique(np.concatenate([np.empty(0, np.uint64), *(p["copies"] for p in parts)]))
    if not len(copies):
        return 0
    jobs = []
    for i, hashes in eval_hashes.items():
        drop = np.isin(hashes, copies)
        if drop.any():
            jobs.append((i, drop))
    done = gather(
        client,
        [client.submit(drop_rows, join(stage, "eval", parts[i]["name"]), drop, fs=fs, pure=False) for i, drop in jobs],
        what="encode: dropping eval copies of train rows",
    )
    for (i, _), n in zip(jobs, done, strict=True):
        parts[i]["eval"] -= n
    return sum(done)


def _merge_key_counts(parts: list[pd.Series]) -> pd.DataFrame:
    """(key, count) summed over parts, sorted by count desc then key (deterministic)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame({"key": np.empty(0, np.int64), "count": np.empty(0, np.int64)})
    total = pd.concat(parts).groupby(level=0).sum()
    frame = pd.DataFrame({"key": total.index.to_numpy(np.int64), "count": total.to_numpy(np.int64)})
    return frame.sort_values(["count", "key"], ascending=[False, True], ignore_index=True)
