"""Ingest throughput against a plain pyarrow CSV -> Parquet conversion of the same files.

    python -m bench.ingest                      # 5M rows
    python -m bench.ingest --rows 1000000 --rows 5000000 --plain

For each N: writes N synthetic Criteo rows (pipeline.generate) as FILES gzip
files of one day, then times, on the same files,

- project:   pipeline.ingest.ingest_date on a LocalCluster (one single-threaded
             worker process per core): validation, quarantine, row accounting,
             commit included; peak RSS per worker from /proc (VmHWM + sampling);
- reference: one process, pyarrow.csv.read_csv (multi-threaded, typed columns,
             no validation) + pyarrow.parquet.write_table per file.

With --plain the same rows are also written as one uncompressed file and
ingested with byte-range splitting (ingest.block_size), to show one big file
spread over the workers.  Results: bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow.csv as pacsv

from bench._common import WorkerMemory, mib, print_table, run_child, write_json
from pipeline.cluster import dask_client, local_worker_count
from pipeline.config import DaskConfig, IngestConfig, InputConfig
from pipeline.generate import generate_day
from pipeline.ingest import ingest_date

DATE = "2026-03-01"
FILES = 4

_REFERENCE = r"""
import json, sys, time
import pyarrow.csv as pacsv, pyarrow.parquet as pq
from pipeline.schema import CRITEO
from bench._common import proc_memory
out, files = sys.argv[1], sys.argv[2:]
t0 = time.perf_counter()
rows = 0
for i, path in enumerate(files):
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=list(CRITEO.columns), use_threads=True),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
    )
    pq.write_table(table, f"{out}/ref-{i:05d}.parquet")
    rows += table.num_rows
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": rows, "peak_rss": proc_memory()["peak_rss"]}))
"""


def write_inputs(directory: Path, rows: int, *, plain: bool) -> tuple[list[Path], Path | None]:
    """FILES gzip files (and optionally one plain file) holding `rows` rows of day DATE."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = [rows // FILES + (1 if i < rows % FILES else 0) for i in range(FILES)]
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    files = []
    plain_path = directory / f"plain-{DATE}.tsv" if plain else None
    plain_file = open(plain_path, "wb") if plain_path else None  # noqa: SIM115 (closed below)
    try:
        for i, n in enumerate(per_file):
            path = directory / f"{DATE}-{i:02d}.tsv.gz"
            files.append(path)
            for start in range(0, n, 500_000):  # generate in slices: the generator holds a slice in memory
                table, _ = generate_day(0, min(500_000, n - start), seed=1000 * i + start // 500_000)
                with gzip.open(path, "ab", compresslevel=1) as f:
                    pacsv.write_csv(table, f, options)
                if plain_file:
                    pacsv.write_csv(table, plain_file, options)
    finally:
        if plain_file:
            plain_file.close()
    return files, plain_path


def run_project(url: str, root: Path, rows: int, ingest: IngestConfig, workers: int) -> dict:
    shutil.rmtree(root, ignore_errors=True)
    config = DaskConfig(n_workers=workers, threads_per_worker=1, processes=True, memory_limit="6GiB")
    with dask_client(config) as client:
        client.wait_for_workers(workers)
        with WorkerMemory(client) as mem:
            t0 = time.perf_counter()
            r = ingest_date(DATE, root=str(root), input=InputConfig(url=url), ingest=ingest, client=client)
            seconds = time.perf_counter() - t0
    if r.rows_written != rows:
        raise RuntimeError(f"ingest wrote {r.rows_written} rows, expected {rows}")
    manifest = json.loads((root / "events" / f"date={DATE}" / "_SUCCESS.json").read_text())
    return {
        "seconds": seconds,
        "rows_per_s": rows / seconds,
        "peak_worker_rss_mib": max(mib(v) for v in mem.peak_bytes.values()),
        "per_worker_rss_mib": {k: round(mib(v), 1) for k, v in mem.peak_bytes.items()},
        "parts": r.parts,
        "tasks": manifest.get("blocks"),
        "slow_chunks": manifest.get("slow_chunks", 0),
    }


def bench_rows(rows: int, work: Path, *, plain: bool, workers: int, block_size: int) -> list[dict]:
    data = work / f"n{rows}"
    files, plain_path = write_inputs(data, rows, plain=plain)
    gz_bytes = sum(p.stat().st_size for p in files)
    raw_bytes = sum(len(gzip.decompress(p.read_bytes())) for p in files)
    out = []

    ref_dir = work / "ref"
    shutil.rmtree(ref_dir, ignore_errors=True)
    ref_dir.mkdir()
    _, stdout = run_child(_REFERENCE, str(ref_dir), *map(str, files))
    ref = json.loads(stdout.strip().splitlines()[-1])
    ref_rate = rows / ref["seconds"]
    proj = run_project(str(data / "{date}-*.tsv.gz"), work / "root", rows, IngestConfig(), workers)
    for name, r, seconds in (("reference (pyarrow, 1 process)", None, ref["seconds"]), ("project ingest", proj, None)):
        s = seconds if seconds is not None else r["seconds"]
        out.append({
            "rows": rows, "input": f"{FILES} x gzip", "run": name, "seconds": s, "rows_per_s": rows / s,
            "MB_per_s_raw": raw_bytes / 1e6 / s, "MB_per_s_gz": gz_bytes / 1e6 / s,
            "ratio": (rows / s) / ref_rate,
            "peak_rss_mib": mib(ref["peak_rss"]) if r is None else r["peak_worker_rss_mib"],
            "detail": "" if r is None else f"parts={r['parts']} slow_chunks={r['slow_chunks']}",
            **({} if r is None else {"per_worker_rss_mib": r["per_worker_rss_mib"]}),
        })  # fmt: skip
    if plain_path is not None:
        size = plain_path.stat().st_size
        ref_dir2 = work / "ref_plain"
        shutil.rmtree(ref_dir2, ignore_errors=True)
        ref_dir2.mkdir()
        _, stdout = run_child(_REFERENCE, str(ref_dir2), str(plain_path))
        ref_p = json.loads(stdout.strip().splitlines()[-1])
        proj_p = run_project(str(data / "plain-{date}.tsv"), work / "root", rows, IngestConfig(block_size=block_size),
                             workers)  # fmt: skip
        for name, r, s in (("reference plain", None, ref_p["seconds"]), ("project plain (byte ranges)", proj_p,
                                                                          proj_p["seconds"])):  # fmt: skip
            out.append({
                "rows": rows, "input": "1 x plain", "run": name, "seconds": s, "rows_per_s": rows / s,
                "MB_per_s_raw": size / 1e6 / s, "MB_per_s_gz": 0.0, "ratio": ref_p["seconds"] / s,
                "peak_rss_mib": mib(ref_p["peak_rss"]) if r is None else r["peak_worker_rss_mib"],
                "detail": "" if r is None else f"tasks={r['tasks']} parts={r['parts']}",
                **({} if r is None else {"per_worker_rss_mib": r["per_worker_rss_mib"]}),
            })  # fmt: skip
    shutil.rmtree(ref_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, action="append", help="rows per run (repeatable; default 5000000)")
    parser.add_argument("--plain", action="store_true", help="also ingest one uncompressed file split in byte ranges")
    parser.add_argument("--workers", type=int, default=0, help="Dask workers (default: one per core, max 4)")
    parser.add_argument("--block-size", type=int, default=64 << 20, help="byte-range size for --plain")
    parser.add_argument("--workdir", default="", help="where inputs and outputs go (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    workers = args.workers or local_worker_count(DaskConfig())
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    results = []
    try:
        for rows in args.rows or [5_000_000]:
            results += bench_rows(rows, work, plain=args.plain, workers=workers, block_size=args.block_size)
            print_table(results, ["rows", "input", "run", "seconds", "rows_per_s", "MB_per_s_raw", "ratio",
                                  "peak_rss_mib", "detail"])  # fmt: skip
            print()
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    path = write_json("ingest", {"workers": workers, "files_per_day": FILES, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
