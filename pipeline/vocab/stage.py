"""Vocab stage: events/date=D/ (+ earlier vocabularies) -> vocab/date=D/.

Everything runs on Dask in pieces of bounded size; the driver only plans and
adds up per-field numbers.  The tasks are in `pipeline.vocab.tasks` and their
files in `pipeline.vocab.parts`; a bucket's rule is `pipeline.vocab.bucket.update_bucket`
and its manifest `pipeline.vocab.manifest`; the pure steps they run are `vocab_counts`,
`vocab_window_merge` / `vocab_delta_merge`, `vocab_admission`, `vocab_buckets`,
`vocab_cap` and `vocab_report`:

1. count: one task per events partition counts its keys into a scratch file
   sorted by key hash;
2. merge: one task per bucket (a range of key hashes, `vocab_buckets`)
   sums the day's counts of its range, reads the same range of the previous
   vocabulary and of the window's day counts, decides admission and eviction,
   and writes its part of day_counts.parquet/ and vocab.parquet/;
3. cap (only with max_keys_per_field, only for fields over it): a few rounds
   of per-bucket score histograms find each field's cut, then each bucket
   applies it;
4. evicted.parquet is concatenated from the buckets' parts (one part at a time),
   report.parquet / report.md are written from the summed per-field numbers,
   and the directory is committed with its manifest last.

Incremental: D's events are the only events read.  When the previous
vocabulary is D - 1's and its window held the same day counts (same run ids)
as D's window minus the day that left it, and decay is 1, a bucket's window is
previous count + D - the dropped day ("delta" merge: three inputs per bucket);
otherwise it re-sums the window's kept day counts ("window" merge).  Both give
the same vocabulary.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import cast

import fsspec
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from distributed import Client

from pipeline.cluster import gather
from pipeline.config import VocabConfig
from pipeline.ingest.manifest import EventsManifest, committed_events
from pipeline.schema import LogSchema, get_schema
from pipeline.vocab.bucket import BucketRule
from pipeline.vocab.buckets import auto_buckets
from pipeline.vocab.cap import CapSearch
from pipeline.vocab.dates import day_number
from pipeline.vocab.manifest import (
    DayFieldStats,
    FieldStats,
    VocabManifest,
    read_vocab_manifest,
)
from pipeline.vocab.parts import SCRATCH, Bucketed, scratch
from pipeline.vocab.report import (
    FieldTotals,
    day_field_stats,
    report_markdown,
    stats_from_totals,
)
from pipeline.vocab.tasks import (
    BucketResult,
    MergePlan,
    cap_round,
    concat_evicted,
    count_part,
    finish_bucket,
    merge_bucket,
)
from storage.io.dates import shift_date, validate_date
from storage.io.fsio import (
    commit_dir,
    committed_data_url,
    join,
    staged,
)
from storage.io.layout import Layout, date_of
from storage.io.version import code_version


@dataclass(frozen=True, slots=True)
class VocabResult:
    """The committed vocabulary of a date, in numbers (the keys are read with `load_admitted`/`load_evicted`)."""

    date: str
    admitted: int
    """Keys admitted at D, all fields."""
    seen: int
    """Keys with a windowed count > 0, all fields."""
    evicted: int
    """Keys evicted at D (to drop from the embedding store)."""
    per_field: list[dict] = field(default_factory=list)
    """Per field: field, seen, admitted, evicted, coverage, oov_rate, missing_rate."""
    day_fields: list[dict] = field(default_factory=list)
    """Per field: field, day_keys, oov_rate_previous (against the vocabulary before D; `vocab_report`)."""
    previous_vocab_date: str | None = None
    """The vocabulary before D that `day_fields` compares with."""
    skipped: bool = False
    run_id: str = ""
    """The committed vocabulary's run id."""
    url: str = ""
    """The committed `vocab/date=D` directory."""

    def summary(self) -> str:
        """One line for the run log."""
        done = " (already committed)" if self.skipped else ""
        return f"vocab {self.date}: {self.admitted} keys admitted of {self.seen} seen, {self.evicted} evicted{done}"


def build_vocab(
    date: str,
    *,
    layout: Layout,
    vocab: VocabConfig,
    fmt: str | LogSchema,
    client: Client,
    force: bool = False,
    incremental: bool = True,
) -> VocabResult:
    """Build and commit the vocabulary of `date` under `vocab/date=D/` (`Layout`).

    The window sums the day counts of D and of the committed vocabularies of
    the `window_days - 1` days before it (days without one are left out and
    the manifest's `window_dates` says which were used).  A committed
    vocabulary built from the same events run and config is kept unless `force`.

    Args:
        incremental: allow the "delta" merge when its conditions hold (see the
            module docstring); False always re-sums the window (same result,
            reads every day of the window; for benchmarks and recovery).

    Raises:
        FileNotFoundError: the events of `date` are not committed.
    """
    validate_date(date)
    schema = get_schema(fmt)
    fs, events_dir, events = committed_events(layout, date)
    final = vocab_dir(layout, date)
    done = read_vocab_manifest(fs, final)
    if done and not force and done.events_run_id == events.run_id and done.config == asdict(vocab):
        return _result(done, skipped=True, url=done.data_dir(layout.vocab(date)))

    rule = BucketRule.of(vocab, list(schema.categorical))  # raises on a min_count_per_field of no field
    window = _committed_window(fs, layout, date, vocab.window_days)  # date -> manifest, without D
    prev_date = latest_vocab_before(fs, layout, date)
    prev = read_vocab_manifest(fs, vocab_dir(layout, prev_date)) if prev_date else None
    delta, dropped = _delta_plan(date, vocab, window, prev_date, prev, fs=fs, layout=layout)
    delta = delta and incremental

    with staged(fs, final) as stage:
        t0 = time.perf_counter()
        outs, distinct = _count_keys(client, fs, stage, events.part_urls(events_dir), date=date, schema=schema)
        t1 = time.perf_counter()
        buckets = vocab.merge_buckets or auto_buckets(
            sum(distinct) + sum(m.day_keys for m in window.values()) + (prev.vocab_rows if prev else 0)
        )
        plan = MergePlan(
            stage=stage,
            date=day_number(date),
            buckets=buckets,
            count_parts=tuple(outs),
            window=() if delta else tuple((day_number(d), _day_counts(layout, d, m)) for d, m in window.items()),
            previous=_vocab_parts(layout, prev_date, prev) if prev_date and prev else None,
            # `dropped` is committed: _delta_plan read its manifest
            dropped=_day_counts(layout, dropped, read_vocab_manifest(fs, vocab_dir(layout, dropped)))  # type: ignore[arg-type]
            if delta and dropped
            else None,
            delta=delta,
            rule=rule,
        )
        results = _merge(client, plan, fs=fs, cap=vocab.max_keys_per_field)
        t2 = time.perf_counter()
        evicted = _concat_evicted(client, stage, results, date=date, fs=fs)
        fs.rm(join(stage, SCRATCH), recursive=True)
        manifest = _report_and_manifest(
            fs, stage, date, schema, vocab, events=events, window=window, prev=prev_date, plan=plan, results=results
        )
        manifest = replace(
            manifest,
            evicted=evicted,
            seconds={
                "count": round(t1 - t0, 3),
                "merge": round(t2 - t1, 3),
                "evicted_and_report": round(time.perf_counter() - t2, 3),
            },
        )
        commit_dir(fs, stage, final, manifest.to_dict())
    return _result(manifest, skipped=False, url=committed_data_url(layout.vocab(date), fs, stage))


def _count_keys(
    client: Client, fs: fsspec.AbstractFileSystem, stage: str, parts: list[str], *, date: str, schema: LogSchema
) -> tuple[list[str], list[int]]:
    """The staging directory's folders, then one task per events part counting its keys into a scratch file
    sorted by key hash; (the scratch files, each part's distinct keys)."""
    for sub in (
        f"{SCRATCH}/counts",
        f"{SCRATCH}/merged",
        f"{SCRATCH}/evicted",
        "day_counts.parquet",
        "vocab.parquet",
    ):
        fs.makedirs(join(stage, sub), exist_ok=True)
    fields = list(schema.categorical)
    multi = [name for name, _ in schema.multi_valued]
    outs = [scratch(stage, "counts", i) for i in range(len(parts))]
    distinct = gather(
        client,
        client.map(count_part, parts, outs, fs=fs, fields=fields, multi_valued=multi, pure=False),
        what=f"vocab {date}: counting keys",
    )
    return outs, distinct


def _concat_evicted(
    client: Client, stage: str, results: list[BucketResult], *, date: str, fs: fsspec.AbstractFileSystem
) -> int:
    """evicted.parquet from the buckets' evicted parts (one task, one part at a time); the keys evicted."""
    return int(
        gather(
            client,
            [
                client.submit(
                    concat_evicted,
                    join(stage, "evicted.parquet"),
                    stage=stage,
                    fs=fs,
                    pure=False,
                    buckets=[b for b, r in enumerate(results) if r.evicted_rows],
                )
            ],
            what=f"vocab {date}: evicted keys",
        )[0]
    )


def _report_and_manifest(
    fs: fsspec.AbstractFileSystem,
    stage: str,
    date: str,
    schema: LogSchema,
    vocab: VocabConfig,
    *,
    events: EventsManifest,
    window: dict[str, VocabManifest],
    prev: str | None,
    plan: MergePlan,
    results: list[BucketResult],
) -> VocabManifest:
    """The report files of the merged buckets, and the day's manifest (its `evicted` and `seconds` still to set)."""
    fields = list(schema.categorical)
    multi = [name for name, _ in schema.multi_valued]
    # every bucket has its totals once merged (and capped)
    totals = sum((cast(FieldTotals, r.totals) for r in results), FieldTotals.zeros(len(fields)))
    stats = stats_from_totals(totals, day_rows=events.rows_written, fields=fields, multi_valued=multi)
    window_dates = sorted([*window, date])
    _write_report(fs, stage, date, stats, window_dates=window_dates, config=vocab)
    run_id = uuid.uuid4().hex
    return VocabManifest(
        date=date,
        format=schema.name,
        config=asdict(vocab),
        window_dates=tuple(window_dates),
        window_runs={**{d: m.run_id for d, m in window.items()}, date: run_id},
        previous_vocab_date=prev,
        merge="delta" if plan.delta else "window",
        buckets=plan.buckets,
        day_rows=events.rows_written,
        day_keys=sum(r.day_keys for r in results),
        vocab_rows=sum(r.vocab_rows for r in results),
        admitted=int(totals.admitted.sum()),
        seen=int(totals.seen.sum()),
        per_field=tuple(FieldStats(**s) for s in stats),
        day_fields=tuple(
            DayFieldStats(**s)
            for s in day_field_stats(totals, day_rows=events.rows_written, fields=fields, multi_valued=multi)
        ),
        events_run_id=events.run_id,
        run_id=run_id,
        code_version=code_version(),
    )


def _write_report(
    fs: fsspec.AbstractFileSystem,
    stage: str,
    date: str,
    stats: list[dict],
    *,
    window_dates: list[str],
    config: VocabConfig,
) -> None:
    """report.parquet (per-field stats, for `load_report`) and report.md (for the flow to publish)."""
    with fs.open(join(stage, "report.parquet"), "wb") as f:
        pd.DataFrame(stats).assign(date=date).to_parquet(f, index=False)
    with fs.open(join(stage, "report.md"), "w") as f:
        f.write(report_markdown(date, stats, window_dates=window_dates, config=config))


def _merge(client: Client, plan: MergePlan, *, fs: fsspec.AbstractFileSystem, cap: int) -> list[BucketResult]:
    """Run the bucket tasks (and, with a cap, the cut search and the finishing tasks); per-bucket results."""
    buckets = range(plan.buckets)
    results = gather(
        client, client.map(merge_bucket, buckets, plan=plan, fs=fs, pure=False), what="vocab: merging buckets"
    )
    if not plan.rule.cap:
        return results
    search = CapSearch(cap=cap, admitted=sum(r.admitted for r in results), buckets=plan.buckets)
    while not search.done:
        search.absorb(
            gather(
                client,
                client.map(cap_round, buckets, plan=plan, fs=fs, query=search.query(), shift=search.shift, pure=False),
                what="vocab: the cap's cut",
            )
        )
    cuts = [{f: (c.bits, c.take[b]) for f, c in search.cuts.items()} for b in buckets]
    return gather(
        client, client.map(finish_bucket, buckets, cuts, plan=plan, fs=fs, pure=False), what="vocab: finishing buckets"
    )


def _committed_window(
    fs: fsspec.AbstractFileSystem, layout: Layout, date: str, window_days: int
) -> dict[str, VocabManifest]:
    """date -> manifest of the committed vocabularies of the window_days - 1 days before `date`."""
    out = {}
    for back in range(window_days - 1, 0, -1):
        d = shift_date(date, -back)
        if (m := read_vocab_manifest(fs, vocab_dir(layout, d))) is not None:
            out[d] = m
    return out


def _delta_plan(
    date: str,
    vocab: VocabConfig,
    window: dict[str, VocabManifest],
    prev_date: str | None,
    prev: VocabManifest | None,
    *,
    fs: fsspec.AbstractFileSystem,
    layout: Layout,
) -> tuple[bool, str | None]:
    """(whether the delta merge gives the exact window, the date that left the window or None).

    It does when decay is 1, the previous vocabulary is of D - 1, and its window
    was exactly this window's other days (same day-count run ids) plus at most
    the day D - window_days, whose day counts are still the ones it used.
    """
    if vocab.decay != 1.0 or prev is None or prev_date != shift_date(date, -1):
        return False, None
    runs = dict(prev.window_runs)
    dropped = shift_date(date, -vocab.window_days)
    dropped_run = runs.pop(dropped, None)
    if runs != {d: m.run_id for d, m in window.items()}:
        return False, None
    if dropped_run is None:
        return True, None
    kept = read_vocab_manifest(fs, vocab_dir(layout, dropped))
    if kept is None or kept.run_id != dropped_run:
        return False, None
    return True, dropped


def _day_counts(layout: Layout, date: str, manifest: VocabManifest) -> Bucketed:
    """The day counts kept by a committed vocabulary."""
    return Bucketed(join(manifest.data_dir(vocab_dir(layout, date)), "day_counts.parquet"), manifest.buckets)


def _vocab_parts(layout: Layout, date: str, manifest: VocabManifest) -> Bucketed:
    return Bucketed(join(manifest.data_dir(vocab_dir(layout, date)), "vocab.parquet"), manifest.buckets)


def vocab_dir(layout: Layout, date: str) -> str:
    """The protocol-less path of `vocab/date=D` on the root's filesystem."""
    return layout.fs(layout.vocab(date))[1]


def latest_vocab_before(fs: fsspec.AbstractFileSystem, layout: Layout, date: str) -> str | None:
    """The most recent date before `date` with a committed vocabulary, or None."""
    base = layout.fs(layout.vocab_parent())[1]
    if not fs.exists(base):
        return None
    dates = [d for entry in fs.ls(base, detail=False) if (d := date_of(entry)) is not None and d < date]
    for d in sorted(dates, reverse=True):
        if read_vocab_manifest(fs, vocab_dir(layout, d)) is not None:
            return d
    return None


def load_admitted(layout: Layout, date: str) -> np.ndarray:
    """The admitted keys of the vocabulary of `date`, sorted int64 (for encoding and the store)."""
    frame = _load(layout, date, "vocab", ["key", "admitted"])
    return np.sort(frame["key"].to_numpy(np.int64)[frame["admitted"].to_numpy(bool)])


def load_evicted(layout: Layout, date: str) -> np.ndarray:
    """The keys evicted at `date`, sorted int64 (to drop from the embedding store)."""
    return np.sort(_load(layout, date, "evicted", ["key"])["key"].to_numpy(np.int64))


def _load(layout: Layout, date: str, name: str, columns: list[str] | None) -> pd.DataFrame:
    fs, directory = layout.fs(layout.vocab(date))
    if (manifest := read_vocab_manifest(fs, directory)) is None:
        raise FileNotFoundError(f"no committed vocabulary for {date} at {layout.vocab(date)}: run build_vocab first")
    return _read(fs, join(manifest.data_dir(directory), f"{name}.parquet"), columns)


def load_report(layout: Layout, date: str) -> pd.DataFrame:
    """The per-field report of the vocabulary of `date` (field, seen, admitted, evicted, coverage, oov_rate, ...)."""
    return _load(layout, date, "report", None)


def _read(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet file or a directory of parts (vocab.parquet/, day_counts.parquet/) as one frame."""
    if fs.isdir(path):
        return pq.read_table(path, filesystem=fs, columns=columns).to_pandas()
    with fs.open(path, "rb") as f:
        return pq.read_table(f, columns=columns).to_pandas()


def _result(manifest: VocabManifest, *, skipped: bool, url: str) -> VocabResult:
    return VocabResult(
        date=manifest.date,
        admitted=manifest.admitted,
        seen=manifest.seen,
        evicted=manifest.evicted,
        per_field=[asdict(s) for s in manifest.per_field],
        day_fields=[asdict(s) for s in manifest.day_fields],
        previous_vocab_date=manifest.previous_vocab_date,
        skipped=skipped,
        run_id=manifest.run_id,
        url=url,
    )
