"""Ingest throughput against a plain pyarrow CSV -> Parquet conversion of the same files.

    python -m bench.ingest                      # 5M rows
    python -m bench.ingest --rows 1000000 --rows 5000000 --plain --repeat 3
    python -m bench.ingest --smoke              # 20k rows, one worker, seconds (checks it runs)

For each N: writes N synthetic Criteo rows (pipeline.generate) as FILES gzip
files of one day, then times, on the same files,

- project:   pipeline.ingest.stage.ingest_date on a LocalCluster (one single-threaded
             worker process per core): validation, quarantine, row accounting,
             commit included; peak RSS per worker from /proc (VmHWM + sampling);
- reference: one process, pyarrow.csv.read_csv (multi-threaded, typed columns,
             no validation) + pyarrow.parquet.write_table per file.

Both clocks start with the code imported: the reference after `import pyarrow`,
the project after its workers imported `pipeline.ingest.tasks` (a one-off per cluster,
reported as `worker_import_s`).  `cpu_s` is the CPU time each side used
(reference: its process; project: the worker processes), which shows the work
done even when other load on the machine skews the wall clock.  With --repeat K
the pair runs K times and the table shows medians (ratio: median of the K
ratios; all of them in `ratios`).

With --plain the same rows are also written as one uncompressed file and
ingested with byte-range splitting (ingest.block_size), to show one big file
spread over the workers.

With --task-rows M (repeatable) it also measures one task alone: one gzip file
of M rows ingested by `pipeline.ingest.tasks.ingest_file` in a fresh process with a
LocalCluster worker's malloc settings, reporting its peak RSS (VmHWM) and its
growth over the imported process.  A gzip file cannot be split, so a real day
(one 46 GB file) is one such task: its peak must not grow with M.

    python -m bench.ingest --rows 1000000 --task-rows 250000 --task-rows 1000000 --task-rows 4000000

Results: bench/results/ingest.json.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.csv as pacsv

from bench._common import (
    WorkerMemory,
    add_smoke,
    apply_smoke,
    mib,
    print_table,
    run_child,
    write_json,
)
from pipeline.cluster import dask_client, local_worker_count, worker_environ
from pipeline.config import DaskConfig, IngestConfig, InputConfig
from pipeline.generate import generate_day
from pipeline.ingest.stage import ingest_date
from storage.io.layout import Layout

DATE = "2026-03-01"
FILES = 4

_REFERENCE = r"""
import json, sys, time
import pyarrow.csv as pacsv, pyarrow.parquet as pq
from pipeline.schema import CRITEO
from bench._common import proc_memory
out, files = sys.argv[1], sys.argv[2:]
t0, c0 = time.perf_counter(), time.process_time()
rows = 0
for i, path in enumerate(files):
    table = pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=list(CRITEO.columns), use_threads=True),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
    )
    pq.write_table(table, f"{out}/ref-{i:05d}.parquet")
    rows += table.num_rows
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "rows": rows,
                  "peak_rss": proc_memory()["peak_rss"]}))
"""

_TASK = r"""
import json, sys, time
from bench._common import proc_memory
from pipeline.ingest.tasks import FileTask, ingest_file
from pipeline.schema import CRITEO
from storage.io.fsio import get_fs
url, out, date, rows_per_partition = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fs, _ = get_fs(out)
for d in ("events", "quarantine"):
    fs.makedirs(f"{out}/{d}", exist_ok=True)
base = proc_memory()["rss"]
t0 = time.perf_counter()
r = ingest_file(FileTask(url=url, file_index=0, schema=CRITEO, input_options=None, out_fs=fs,
                         events_dir=f"{out}/events", quarantine_dir=f"{out}/quarantine",
                         rows_per_partition=rows_per_partition, date=date))
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": r["rows_written"], "base_rss": base,
                  "peak_rss": proc_memory()["peak_rss"]}))
"""


def write_gzip(path: Path, rows: int, *, seed: int = 0) -> None:
    """One gzip file of `rows` synthetic Criteo rows of day DATE, generated in slices of 500k rows."""
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with gzip.open(path, "wb", compresslevel=1) as f:
        for start in range(0, rows, 500_000):  # the generator holds a slice in memory
            table, _ = generate_day(0, min(500_000, rows - start), seed=seed + start // 500_000)
            pacsv.write_csv(table, f, options)


def task_peak(rows: int, work: Path, ingest: IngestConfig) -> dict:
    """Peak RSS of one ingest task (one gzip file of `rows` rows) in a fresh process with a worker's malloc settings."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"task-{rows}.tsv.gz"
    write_gzip(path, rows)
    out = work / "task-root"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, **worker_environ()}
    done = subprocess.run(
        [sys.executable, "-c", _TASK, str(path), str(out), DATE, str(ingest.rows_per_partition)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    shutil.rmtree(out, ignore_errors=True)
    path.unlink()
    r = json.loads(done.stdout.strip().splitlines()[-1])
    if r["rows"] != rows:
        raise RuntimeError(f"the task wrote {r['rows']} rows, expected {rows}")
    return {
        "rows_per_file": rows,
        "rows_per_partition": ingest.rows_per_partition,
        "seconds": r["seconds"],
        "base_rss_mib": mib(r["base_rss"]),
        "peak_rss_mib": mib(r["peak_rss"]),
        "task_growth_mib": mib(r["peak_rss"] - r["base_rss"]),
    }


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
            path.unlink(missing_ok=True)  # slices are appended below: never onto a file of an earlier run
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
        t0 = time.perf_counter()
        client.run(importlib.import_module, "pipeline.ingest.tasks")
        import_s = time.perf_counter() - t0
        cpu0 = client.run(time.process_time)
        with WorkerMemory(client) as mem:
            t0 = time.perf_counter()
            r = ingest_date(DATE, layout=Layout(str(root)), input=InputConfig(url=url), ingest=ingest, client=client)
            seconds = time.perf_counter() - t0
        cpu_s = sum(c - cpu0[w] for w, c in client.run(time.process_time).items())
    if r.rows_written != rows:
        raise RuntimeError(f"ingest wrote {r.rows_written} rows, expected {rows}")
    manifest = json.loads((Path(Layout(str(root)).events(DATE)) / "_SUCCESS.json").read_text())
    return {
        "seconds": seconds,
        "cpu_s": cpu_s,
        "worker_import_s": import_s,
        "peak_rss": max(mem.peak_bytes.values()),
        "per_worker_rss_mib": {k: round(mib(v), 1) for k, v in mem.peak_bytes.items()},
        "parts": r.parts,
        "tasks": manifest.get("blocks"),
        "slow_chunks": manifest.get("slow_chunks", 0),
    }


def run_reference(paths: list[Path], out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    _, stdout = run_child(_REFERENCE, str(out), *map(str, paths))
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(stdout.strip().splitlines()[-1])


def compare(rows: int, input_name: str, raw_bytes: int, gz_bytes: int, ref: list[dict], proj: list[dict]) -> list[dict]:
    """The reference row and the project row of one input kind: medians over the repeats."""
    ratios = [r["seconds"] / p["seconds"] for r, p in zip(ref, proj, strict=True)]
    out = []
    for name, runs in ((f"reference {input_name}", ref), (f"project {input_name}", proj)):
        s = statistics.median(r["seconds"] for r in runs)
        is_proj = runs is proj
        out.append(
            {
                "rows": rows,
                "input": input_name,
                "run": name,
                "seconds": s,
                "rows_per_s": rows / s,
                "MB_per_s_raw": raw_bytes / 1e6 / s,
                "MB_per_s_gz": gz_bytes / 1e6 / s,
                "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "ratio": statistics.median(ratios) if is_proj else 1.0,
                "ratios": [round(x, 3) for x in ratios] if is_proj else [],
                "peak_rss_mib": mib(max(r["peak_rss"] for r in runs)),
                "detail": ""
                if not is_proj
                else (
                    f"tasks={runs[0]['tasks']} parts={runs[0]['parts']} slow_chunks={runs[0]['slow_chunks']} "
                    f"import={statistics.median(r['worker_import_s'] for r in runs):.2f}s"
                ),
                **({"per_worker_rss_mib": runs[-1]["per_worker_rss_mib"]} if is_proj else {}),
            }
        )
    return out


def bench_rows(rows: int, work: Path, *, plain: bool, workers: int, block_size: int, repeat: int) -> list[dict]:
    data = work / f"n{rows}"
    files, plain_path = write_inputs(data, rows, plain=plain)
    gz_bytes = sum(p.stat().st_size for p in files)
    raw_bytes = sum(len(gzip.decompress(p.read_bytes())) for p in files)
    ref, proj = [], []
    for _ in range(repeat):  # the pair back to back, so both see about the same load on the machine
        ref.append(run_reference(files, work / "ref"))
        proj.append(run_project(str(data / "{date}-*.tsv.gz"), work / "root", rows, IngestConfig(), workers))
    out = compare(rows, f"{FILES} x gzip", raw_bytes, gz_bytes, ref, proj)
    if plain_path is not None:
        ref, proj = [], []
        for _ in range(repeat):
            ref.append(run_reference([plain_path], work / "ref"))
            proj.append(
                run_project(
                    str(data / "plain-{date}.tsv"), work / "root", rows, IngestConfig(block_size=block_size), workers
                )
            )
        out += compare(rows, "1 x plain", plain_path.stat().st_size, 0, ref, proj)
    return out


SMOKE = {"rows": [20_000], "plain": True, "workers": 1, "repeat": 1, "task_rows": [5_000]}
"""`--smoke`: 20k rows as gzip files and one plain file, one Dask worker; one task of 5k rows alone."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=int,
        action="append",
        help="rows per run (repeatable; default 5000000 unless only --task-rows is given)",
    )
    parser.add_argument("--plain", action="store_true", help="also ingest one uncompressed file split in byte ranges")
    parser.add_argument("--workers", type=int, default=0, help="Dask workers (default: one per core, max 4)")
    parser.add_argument("--block-size", type=int, default=64 << 20, help="byte-range size for --plain")
    parser.add_argument("--workdir", default="", help="where inputs and outputs go (default: a temp dir, removed)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each reference/project pair (medians shown)")
    parser.add_argument(
        "--task-rows",
        type=int,
        action="append",
        default=[],
        help="also measure one ingest task alone on one gzip file of this many rows (repeatable)",
    )
    add_smoke(parser)
    args = apply_smoke(parser.parse_args(argv), SMOKE)
    workers = args.workers or local_worker_count(DaskConfig())
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    results: list[dict] = []
    try:
        tasks = [task_peak(rows, work, IngestConfig()) for rows in args.task_rows]
        if tasks:
            print_table(tasks)
            print()
        for rows in args.rows or ([] if args.task_rows else [5_000_000]):
            results += bench_rows(
                rows, work, plain=args.plain, workers=workers, block_size=args.block_size, repeat=args.repeat
            )
            print_table(
                results,
                [
                    "rows",
                    "input",
                    "run",
                    "seconds",
                    "rows_per_s",
                    "MB_per_s_raw",
                    "cpu_s",
                    "ratio",
                    "peak_rss_mib",
                    "detail",
                ],
            )
            print()
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    path = write_json(
        "ingest",
        {"workers": workers, "files_per_day": FILES, "repeat": args.repeat, "results": results, "task_peaks": tasks},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
