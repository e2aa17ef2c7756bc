"""Vocab stage: events/date=D/ (+ earlier vocabularies) -> vocab/date=D/.

Dask counts the day's keys per events partition; the driver merges them with
the day counts kept by the previous vocabularies of the window and the
previous vocabulary's first/last-seen dates (logic in `pipeline.vocab`).
Writes day_counts.parquet, vocab.parquet, evicted.parquet and the report
(report.parquet: one row per field with seen, admitted, evicted, coverage,
oov_rate, missing_rate; report.md: the same as a short markdown summary the
flow can publish), committed with a manifest holding the stats.

Incremental: a daily run counts only day D's events (one Dask task per events
partition); the other days of the window come from the day_counts.parquet
kept by their committed vocabularies, so the daily cost is one day of
counting plus a merge of `window_days` count tables.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field

import fsspec
import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
from distributed import Client

from pipeline.config import VocabConfig
from pipeline.schema import LogSchema, get_schema
from pipeline.vocab import (
    count_keys,
    field_stats,
    merge_counts,
    report_markdown,
    update_vocab,
    window_counts,
)
from storage.fsio import (
    code_version,
    commit_dir,
    get_fs,
    join,
    read_manifest,
    shift_date,
    staged,
    validate_date,
)


@dataclass(frozen=True, slots=True)
class VocabResult:
    date: str
    admitted: int
    """Keys admitted at D, all fields."""
    seen: int
    """Keys with a windowed count > 0, all fields."""
    evicted: int
    """Keys evicted at D (to drop from the embedding store)."""
    per_field: list[dict] = field(default_factory=list)
    """Per field: field, seen, admitted, evicted, coverage, oov_rate, missing_rate."""
    skipped: bool = False


def build_vocab(
    date: str,
    *,
    root: str,
    vocab: VocabConfig,
    fmt: str | LogSchema,
    client: Client,
    force: bool = False,
    storage_options: dict | None = None,
) -> VocabResult:
    """Build and commit the vocabulary of `date` under `<root>/vocab/date=D/`.

    The window sums the day counts of D and of the committed vocabularies of
    the `window_days - 1` days before it (days without one are left out and
    the manifest's `window_dates` says which were used).  A committed
    vocabulary built from the same events run and config is kept unless `force`.

    Raises:
        FileNotFoundError: the events of `date` are not committed.
    """
    validate_date(date)
    schema = get_schema(fmt)
    fs, root_path = get_fs(root, storage_options)
    events_dir = join(root_path, "events", f"date={date}")
    events = read_manifest(fs, events_dir)
    if events is None:
        raise FileNotFoundError(f"no committed events for {date} at {join(root, 'events', f'date={date}')}: run ingest first")
    final = vocab_dir(root_path, date)
    done = read_manifest(fs, final)
    if done and not force and done.get("events_run_id") == events.get("run_id") and done.get("config") == asdict(vocab):
        return _result(done, skipped=True)

    multi = [name for name, _ in schema.multi_valued]
    if unknown := sorted(set(vocab.min_count_per_field) - set(schema.categorical)):
        raise ValueError(f"vocab.min_count_per_field names unknown fields {unknown}; {schema.name} fields are "
                         f"{list(schema.categorical)}")  # fmt: skip
    futures = client.map(
        _count_part,
        [join(events_dir, p["name"]) for p in events["parts"]],
        fs=fs,
        fields=list(schema.categorical),
        multi_valued=multi,
        pure=False,
    )
    day = merge_counts(client.gather(futures))

    dated = {date: day}
    for back in range(1, vocab.window_days):
        d = shift_date(date, -back)
        if read_manifest(fs, vocab_dir(root_path, d)) is not None:
            dated[d] = _read(fs, join(vocab_dir(root_path, d), "day_counts.parquet"))
    prev_date = latest_vocab_before(fs, root_path, date)
    previous = _read(fs, join(vocab_dir(root_path, prev_date), "vocab.parquet")) if prev_date else None
    window = window_counts(dated, date=date, decay=vocab.decay)
    update = update_vocab(date=date, window=window, previous=previous, config=vocab, fields=schema.categorical)
    stats = field_stats(
        vocab=update.vocab,
        evicted=update.evicted,
        day_counts=day,
        day_rows=events["rows_written"],
        fields=schema.categorical,
        multi_valued=multi,
    )

    with staged(fs, final) as stage:
        report = pd.DataFrame(stats).assign(date=date)
        for name, frame in (
            ("day_counts", day), ("vocab", update.vocab), ("evicted", update.evicted), ("report", report)
        ):  # fmt: skip
            with fs.open(join(stage, f"{name}.parquet"), "wb") as f:
                frame.to_parquet(f, index=False)
        with fs.open(join(stage, "report.md"), "w") as f:
            f.write(report_markdown(date, stats, window_dates=sorted(dated), config=vocab))
        manifest = {
            "date": date,
            "format": schema.name,
            "config": asdict(vocab),
            "window_dates": sorted(dated),
            "previous_vocab_date": prev_date,
            "day_rows": events["rows_written"],
            "admitted": int(update.vocab["admitted"].sum()),
            "seen": int((update.vocab["count"] > 0).sum()),
            "evicted": len(update.evicted),
            "per_field": stats,
            "events_run_id": events.get("run_id"),
            "run_id": uuid.uuid4().hex,
            "code_version": code_version(),
        }
        commit_dir(fs, stage, final, manifest)
    return _result(manifest, skipped=False)


def vocab_dir(root_path: str, date: str) -> str:
    return join(root_path, "vocab", f"date={date}")


def latest_vocab_before(fs: fsspec.AbstractFileSystem, root_path: str, date: str) -> str | None:
    """The most recent date before `date` with a committed vocabulary, or None."""
    base = join(root_path, "vocab")
    if not fs.exists(base):
        return None
    dates = []
    for entry in fs.ls(base, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("date=") and len(name) == 15 and name[5:] < date:
            dates.append(name[5:])
    for d in sorted(dates, reverse=True):
        if read_manifest(fs, vocab_dir(root_path, d)) is not None:
            return d
    return None


def load_admitted(root: str, date: str, storage_options: dict | None = None) -> np.ndarray:
    """The admitted keys of the vocabulary of `date`, sorted int64 (for encoding and the store)."""
    frame = _load(root, date, "vocab", ["key", "admitted"], storage_options)
    return np.sort(frame["key"].to_numpy(np.int64)[frame["admitted"].to_numpy(bool)])


def load_evicted(root: str, date: str, storage_options: dict | None = None) -> np.ndarray:
    """The keys evicted at `date`, sorted int64 (to drop from the embedding store)."""
    return np.sort(_load(root, date, "evicted", ["key"], storage_options)["key"].to_numpy(np.int64))


def _load(root: str, date: str, name: str, columns: list[str] | None, storage_options: dict | None) -> pd.DataFrame:
    fs, root_path = get_fs(root, storage_options)
    directory = vocab_dir(root_path, validate_date(date))
    if read_manifest(fs, directory) is None:
        raise FileNotFoundError(f"no committed vocabulary for {date} at {join(root, 'vocab', f'date={date}')}: run build_vocab first")
    return _read(fs, join(directory, f"{name}.parquet"), columns)


def load_report(root: str, date: str, storage_options: dict | None = None) -> pd.DataFrame:
    """The per-field report of the vocabulary of `date` (field, seen, admitted, evicted, coverage, oov_rate, ...)."""
    return _load(root, date, "report", None, storage_options)


def _count_part(
    path: str, *, fs: fsspec.AbstractFileSystem, fields: list[str], multi_valued: list[str] = ()
) -> pd.DataFrame:
    """Dask task: key counts of one events partition (multi-valued fields count every value)."""
    with fs.open(path, "rb") as f:
        table = pq.read_table(f, columns=fields)
    columns = {
        name: (pc.list_flatten(table.column(name)) if name in multi_valued else table.column(name)).to_pandas()
        for name in fields
    }
    return count_keys(columns, fields)


def _read(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None = None) -> pd.DataFrame:
    with fs.open(path, "rb") as f:
        return pq.read_table(f, columns=columns).to_pandas()


def _result(manifest: dict, *, skipped: bool) -> VocabResult:
    return VocabResult(
        date=manifest["date"],
        admitted=manifest["admitted"],
        seen=manifest["seen"],
        evicted=manifest["evicted"],
        per_field=manifest["per_field"],
        skipped=skipped,
    )
