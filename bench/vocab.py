"""Vocabulary build over a 7-day window of high-cardinality synthetic days.

    python -m bench.vocab                          # 7 days x 700k rows, >= 1e7 distinct keys in the window
    python -m bench.vocab --rows 500000 --days 7   # quicker

Writes events directly (no raw text: this measures the vocabulary stage, not
ingest): every day has `rows` rows of 26 categorical fields, most values
unique to the day (`--new-share`), so the window holds 10^7+ distinct keys.
Then it times

- chain: days 1..7 built in order (each counts its own day once);
- incremental: the daily update of day 7 alone (force=True), which counts day 7
  and merges the kept day counts of days 1..6;
- count only: the Dask counting of day 7's events (no merge), the floor;
- count all days: what a non-incremental build would have to count.

Peak RSS of the driver (merge happens there) and of each worker.  Results:
bench/results/vocab.json.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bench._common import (
    WorkerMemory,
    mib,
    print_table,
    proc_memory,
    reset_peak_rss,
    write_json,
)
from pipeline.cluster import dask_client, local_worker_count
from pipeline.config import DaskConfig, VocabConfig
from pipeline.schema import CRITEO
from pipeline.vocab import merge_counts
from pipeline.vocab_stage import _count_part, build_vocab
from storage.fsio import date_range, get_fs
from storage.fsio import write_json as write_manifest

PART_ROWS = 250_000


def write_events(root: Path, dates: list[str], rows: int, new_share: float, seed: int = 0) -> None:
    """Committed events for `dates`: `new_share` of each field's values are unique to the day."""
    schema = CRITEO.events_schema()
    for d, date in enumerate(dates):
        out = root / "events" / f"date={date}"
        out.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng([seed, d])
        parts = []
        for p, start in enumerate(range(0, rows, PART_ROWS)):
            n = min(PART_ROWS, rows - start)
            cols = {"label": pa.array(rng.integers(0, 2, n).astype(np.int8)), "ts": pa.nulls(n, pa.int64()),
                    "order": pa.array(np.arange(start, start + n, dtype=np.int64))}  # fmt: skip
            for name in CRITEO.dense:
                cols[name] = pa.array(rng.random(n).astype(np.float32))
            for j, name in enumerate(CRITEO.categorical):
                fresh = rng.random(n) < new_share
                shared = rng.zipf(1.3, n) % 50_000
                ids = np.where(fresh, (d + 1) * 10**9 + start + np.arange(n), shared)
                text = pc.cast(pa.array(ids), pa.string())
                cols[name] = pc.binary_join_element_wise(f"f{j}-", text, "")
            name = f"part-{p:05d}.parquet"
            pq.write_table(pa.table(cols, schema=schema), out / name)
            parts.append({"name": name, "rows": n})
        fs, _ = get_fs(str(root))
        write_manifest(fs, str(out / "_SUCCESS.json"), {"date": date, "format": "criteo", "rows_written": rows,
                                                         "parts": parts, "run_id": f"bench-{date}"})  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=700_000, help="rows per day")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--new-share", type=float, default=0.1, help="share of values unique to their day")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--workdir", default="")
    args = parser.parse_args(argv)
    workers = args.workers or local_worker_count(DaskConfig())
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-vocab-"))
    dates = date_range("2026-04-01", f"2026-04-{args.days:02d}")
    cfg = VocabConfig(window_days=args.days, min_count=2)
    rows_out = []
    try:
        t0 = time.perf_counter()
        write_events(work, dates, args.rows, args.new_share)
        print(f"wrote {args.days} days x {args.rows:,} rows of events in {time.perf_counter() - t0:.1f}s")
        with dask_client(DaskConfig(n_workers=workers, memory_limit="6GiB")) as client:
            client.wait_for_workers(workers)
            reset_peak_rss()
            with WorkerMemory(client) as mem:
                t0 = time.perf_counter()
                for d in dates:
                    r = build_vocab(d, root=str(work), vocab=cfg, fmt="criteo", client=client)
                chain = time.perf_counter() - t0
            driver_chain = proc_memory()["peak_rss"]
            seen = r.seen
            rows_out.append({"run": f"chain: {args.days} daily builds", "seconds": chain,
                             "rows_per_s": args.days * args.rows / chain, "keys_in_window": seen,
                             "driver_peak_mib": mib(driver_chain),
                             "worker_peak_mib": max(mib(v) for v in mem.peak_bytes.values())})  # fmt: skip

            reset_peak_rss()
            with WorkerMemory(client) as mem:
                t0 = time.perf_counter()
                build_vocab(dates[-1], root=str(work), vocab=cfg, fmt="criteo", client=client, force=True)
                inc = time.perf_counter() - t0
            rows_out.append({"run": "incremental update of the last day", "seconds": inc,
                             "rows_per_s": args.rows / inc, "keys_in_window": seen,
                             "driver_peak_mib": mib(proc_memory()["peak_rss"]),
                             "worker_peak_mib": max(mib(v) for v in mem.peak_bytes.values())})  # fmt: skip

            fs, root_path = get_fs(str(work))
            events_dir = work / "events" / f"date={dates[-1]}"
            paths = sorted(str(p) for p in events_dir.glob("part-*.parquet"))
            t0 = time.perf_counter()
            day = merge_counts(client.gather(client.map(_count_part, paths, fs=fs, fields=list(CRITEO.categorical),
                                                        pure=False)))  # fmt: skip
            count = time.perf_counter() - t0
            rows_out.append({"run": "count one day only (floor)", "seconds": count, "rows_per_s": args.rows / count,
                             "keys_in_window": len(day), "driver_peak_mib": 0.0, "worker_peak_mib": 0.0})  # fmt: skip
            all_paths = sorted(str(p) for d in dates for p in (work / "events" / f"date={d}").glob("part-*.parquet"))
            t0 = time.perf_counter()
            window = merge_counts(client.gather(client.map(_count_part, all_paths, fs=fs,
                                                           fields=list(CRITEO.categorical), pure=False)))  # fmt: skip
            count_all = time.perf_counter() - t0
            rows_out.append({"run": f"count all {args.days} days (non-incremental)", "seconds": count_all,
                             "rows_per_s": args.days * args.rows / count_all, "keys_in_window": len(window),
                             "driver_peak_mib": 0.0, "worker_peak_mib": 0.0})  # fmt: skip
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows_out)
    print(f"incremental / one-day count = {rows_out[1]['seconds'] / rows_out[2]['seconds']:.2f}; "
          f"incremental / {args.days}-day count = {rows_out[1]['seconds'] / rows_out[3]['seconds']:.2f}; "
          f"chain / {args.days} = {rows_out[0]['seconds'] / args.days:.1f}s per day")  # fmt: skip
    path = write_json("vocab", {"rows_per_day": args.rows, "days": args.days, "new_share": args.new_share,
                                "workers": workers, "results": rows_out})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
