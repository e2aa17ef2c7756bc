"""The day as a user waits for it: `ctrpipe backfill` over consecutive generated days, stage by stage.

    python -m bench.day [--rows 1000000 --rows 5000000] [--days 3] [--no-reference] [--smoke]
    python -m bench.day --rows 1000000 --days 3 --no-reference --row-formats adam/fp32   # rows' cost on the day

For each N rows/day: writes `--days` days of synthetic Criteo logs (`pipeline.generate`), runs
`ctrpipe backfill` over them in a fresh process with the default preset (the product path:
Prefect's ephemeral server, ingest running ahead, the model's slot), and reads each day's
metrics.json: per stage and per overhead (`flows.day.run.OVERHEADS`) the wall seconds, its share of
the day, and the CPU seconds the whole process tree used meanwhile (`bench._proctree`); per
process kind (driver, Dask worker, torchrun agent, rank, Prefect server) the peak RSS.  With
two sizes or more, the growth exponent of each part, ln(t2 / t1) / ln(N2 / N1) between the
smallest and the largest size, from its mean over days 2.. (day 1 trains cold and ingests alone).

The reference, on the same rows, is the bare minimum a script would do: pyarrow CSV -> Parquet of
the day's file (`bench.ingest.run_reference`), then the plain PyTorch loop of `bench.train`
(`run_plain`: nn.EmbeddingBag + SparseAdam, the same default CTRModel, one epoch of the day's
train rows in batches of the default size, one torch thread as a rank has), timed from loading its
arrays to its last step, in a fresh process with the ranks' malloc settings.  No vocabulary, no
checks, no evaluation, no Prefect.  `vs_reference` = our day's wall time (mean of days 2..) over it.

MFU of the training loop per day (`train mfu`): the day's examples/s per rank x the default model's
FLOPs per example (forward + backward, `bench._mfu`) / the fp32 matmul rate one thread attains on the
model's widest layer at the day's batch, measured in this process after the backfill (the ranks run one
thread each).  The reference's loop gets the same column.

`--row-formats F ...` runs the backfill again on the same day files with each other row format
(`optimizer/row_dtype[/state_dtype]`, through `--set`), one root each, and a last table sets the train
seconds, examples/s, wall time, AUC and rank peak RSS of each (days 2..) beside the default's, with ratios.

Goals (from day 2 on): training >= 90% of the day at 1M rows; every part's growth exponent
<= 1.05; our day <= 1.15x the reference.  Results: bench/results/day.json.
`--smoke`: 2 days of 3,000 rows (about a minute: the flow's start-up dominates; checks it runs).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._common import (
    add_smoke,
    apply_smoke,
    mib,
    print_table,
    row_format_overrides,
    write_json,
)
from bench._mfu import mfu
from bench._proctree import KINDS, ProcessTree
from bench.ingest import run_reference
from bench.train import RANK_MALLOC_ENV, model_fields, probe_flops
from flows.config import RunConfig
from flows.day.record import DayRecord, read_record
from flows.day.run import OVERHEADS, STAGES
from pipeline.generate import generate_days
from storage.io.dates import date_range, shift_date
from trainer.plan.recipe import derive

REPO = Path(__file__).resolve().parents[1]
START = "2026-01-01"
PARTS = (*(s.name for s in STAGES), *OVERHEADS)
GOAL_TRAIN_SHARE, GOAL_EXPONENT, GOAL_VS_REFERENCE = 0.90, 1.05, 1.15
SMOKE = {"rows": [3_000], "days": 2}

_PLAIN = r"""
import json, sys, time, torch
from pathlib import Path
from bench.train import run_plain
torch.set_num_threads(1)
t0 = time.perf_counter()
r = run_plain(Path(sys.argv[1]), **json.loads(sys.argv[2]))
print(json.dumps({**r, "total_s": time.perf_counter() - t0}))
"""


def run_backfill(rows: int, days: int, work: Path, row_format: str | None = None) -> dict[str, Any]:
    """Generate the days, run `ctrpipe backfill` over them in a fresh process; per-day records and process stats.
    `row_format` (optimizer/row_dtype[/state_dtype]) runs it with those rows instead of the default's, on the
    same day files, in a root of its own."""
    tag = f"{rows}" if row_format is None else f"{rows}-{row_format.replace('/', '-')}"
    raw, root = work / f"raw-{rows}", work / f"root-{tag}"
    end = shift_date(START, days - 1)
    if not (raw / f"day_{end}.tsv.gz").exists():
        generate_days(str(raw), days, rows, seed=0, start_date=START)
    env = {
        **os.environ,
        "PREFECT_HOME": str(work / f"prefect-{tag}"),
        "TMPDIR": str(work),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    sets = {
        "root": str(root),
        "input.url": f"{raw}/day_{{date}}.tsv.gz",
        **(row_format_overrides(row_format) if row_format else {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "flows.cli.main",
        "backfill",
        "--start",
        START,
        "--end",
        end,
        *(a for k, v in sets.items() for a in ("--set", f"{k}={v}")),
    ]
    log_path = work / f"backfill-{tag}.log"
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        with ProcessTree(proc.pid) as tree:
            rc = proc.wait()
    total_s = time.time() - t0
    if rc:
        raise RuntimeError(f"ctrpipe backfill ({rows} rows/day) exited {rc}:\n{log_path.read_text()[-3000:]}")
    layout = RunConfig(root=str(root)).layout()
    out = []
    for i, date in enumerate(date_range(START, end)):
        record = read_record(layout, date)
        if record is None or not record.completed:
            raise RuntimeError(f"{date} has no completed record under {root}")
        out.append(day_row(rows, i + 1, record, os.path.getmtime(layout.run_record(date)), tree))
    return {"days": out, "total_s": total_s, "peak_rss": tree.peak_rss_by_kind(), "raw": raw, "root": root}


def day_row(rows: int, day: int, record: DayRecord, written: float, tree: ProcessTree) -> dict[str, Any]:
    """One day: each part's seconds and CPU seconds; the parts ran one after another, ending when the record was
    written.
    """
    t = written - record.wall_s
    row: dict[str, Any] = {"rows": rows, "day": day, "wall": record.wall_s, "seconds": {}, "cpu_s": {}}
    for part, s in record.seconds.items():
        row["seconds"][part] = s
        row["cpu_s"][part] = tree.cpu_between(t, t + s)
        t += s
    row["train_share"] = row["seconds"]["train"] / record.wall_s
    row["evaluate"] = record.evaluate
    row["auc"] = record.auc
    row["train_examples_per_s"] = record.train.get("examples_per_s")
    row["world_size"] = record.train.get("world_size") or 1
    row["batch"] = record.train.get("recipe", {}).get("values", {}).get("optim.batch_size")
    return row


def run_plain_reference(features: Path, rows_train: int) -> dict[str, Any]:
    """The plain loop over one epoch of `rows_train` rows at the 1-rank recipe's batch and learning rates (the
    default model), in a fresh process with the ranks' malloc settings."""
    cfg = RunConfig()
    recipe = derive(cfg.optim, cfg.model, rows=rows_train, world_size=1)
    batch = int(recipe.optim.batch_size)
    kw = {
        "batch": batch,
        "dim": cfg.store.embedding_dim,
        "lr": recipe.optim.lr,
        "sparse_lr": recipe.optim.sparse_lr,
        "steps": -(-rows_train // batch),
        "config": model_fields(recipe.model),
        "cross_lr_scale": recipe.optim.cross_lr_scale,
        "wide_loss": recipe.optim.wide_loss,
    }
    env = {**os.environ, **RANK_MALLOC_ENV, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN, str(features), json.dumps(kw)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the plain PyTorch reference failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reference(run: dict[str, Any], work: Path) -> dict[str, Any]:
    """The bare-minimum day on day 2's rows: pyarrow conversion, then the plain loop on the same train rows."""
    date = shift_date(START, 1)
    converted = run_reference([run["raw"] / f"day_{date}.tsv.gz"], work / "reference-parquet")
    layout = RunConfig(root=str(run["root"])).layout()
    record = read_record(layout, date)
    plain = run_plain_reference(Path(layout.features(date)), record.rows_train)
    return {
        "convert_s": converted["seconds"],
        "train_s": plain["total_s"],
        "loop_s": plain["train_s"],
        "total_s": converted["seconds"] + plain["total_s"],
        "steps": plain["steps"],
        "loop_examples_per_s": plain["examples_per_s"],
    }


def add_mfu(runs: dict[int, dict[str, Any]], refs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Column `train_mfu` of every day (and `loop_mfu` of each reference): see the module docstring."""
    cfg = RunConfig()
    probes: dict[int, dict[str, Any]] = {}
    for run in runs.values():
        for d in run["days"]:
            batch = d["batch"] or 1024
            if batch not in probes:
                model = derive(cfg.optim, cfg.model, rows=max(1, d["rows"]), world_size=1).model
                probes[batch] = probe_flops(model, cfg.store, batch)
            p = probes[batch]
            rate = d["train_examples_per_s"]
            d["train_mfu"] = (
                mfu(rate / d["world_size"], p["flops_per_example"], p["attainable_gflops"]) if rate else None
            )
    for n, r in refs.items():
        batch = next((d["batch"] for d in runs[n]["days"] if d["batch"]), None)
        p = probes.get(batch) or next(iter(probes.values()))
        r["loop_mfu"] = mfu(r["loop_examples_per_s"], p["flops_per_example"], p["attainable_gflops"])
    return {str(b): p for b, p in probes.items()}


def steady(days: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Mean over days 2.. (day 1 when there is only one) of each part's `key` (seconds or cpu_s)."""
    later = days[1:] or days
    return {p: statistics.fmean(d[key].get(p, 0.0) for d in later) for p in PARTS}


def exponent(t1: float, t2: float, n1: int, n2: int) -> float | None:
    """Growth exponent of a time between two sizes (None when either time is too small to tell)."""
    if min(t1, t2) < 0.05:
        return None
    return math.log(t2 / t1) / math.log(n2 / n1)


def summarise(runs: dict[int, dict[str, Any]], refs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    sizes = sorted(runs)
    parts_rows, goals = [], []
    for part in PARTS:
        row: dict[str, Any] = {"part": part}
        for n in sizes:
            sec, cpu = steady(runs[n]["days"], "seconds")[part], steady(runs[n]["days"], "cpu_s")[part]
            wall = statistics.fmean(d["wall"] for d in runs[n]["days"][1:] or runs[n]["days"])
            row |= {f"s@{n}": sec, f"share@{n}": sec / wall, f"cpu_s@{n}": cpu}
        if len(sizes) > 1:
            n1, n2 = sizes[0], sizes[-1]
            row["exponent"] = exponent(row[f"s@{n1}"], row[f"s@{n2}"], n1, n2)
        parts_rows.append(row)
    walls = {n: statistics.fmean(d["wall"] for d in runs[n]["days"][1:] or runs[n]["days"]) for n in sizes}
    shares = {n: steady(runs[n]["days"], "seconds")["train"] / walls[n] for n in sizes}
    if 1_000_000 in shares:
        goals.append(
            (
                "training share of the day at 1M rows (days 2..)",
                f"{shares[1_000_000]:.1%}",
                shares[1_000_000] >= GOAL_TRAIN_SHARE,
            )
        )
    stages = {s.name for s in STAGES}  # the goal is about stages; the overheads do not grow with rows
    worst = [(r["part"], r["exponent"]) for r in parts_rows if r["part"] in stages and r.get("exponent") is not None]
    if worst:
        part, e = max(worst, key=lambda x: x[1])
        goals.append((f"largest growth exponent of a stage ({part})", f"{e:.2f}", e <= GOAL_EXPONENT))
    vs = {n: walls[n] / refs[n]["total_s"] for n in refs}
    for n, v in vs.items():
        goals.append((f"our day / bare-minimum reference at {n:,} rows", f"{v:.2f}x", v <= GOAL_VS_REFERENCE))
    return {"parts": parts_rows, "walls": walls, "train_share": shares, "vs_reference": vs, "goals": goals}


def compare_formats(
    runs: dict[int, dict[str, Any]], others: dict[tuple[int, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Per size, the default rows and each other format: train seconds, train examples/s, the day's wall time
    (means over days 2..), the rank's peak RSS, and the ratios to the default's."""

    def row(n: int, name: str, run: dict[str, Any]) -> dict[str, Any]:
        later = run["days"][1:] or run["days"]
        return {
            "rows": n,
            "format": name,
            "train_s": statistics.fmean(d["seconds"]["train"] for d in later),
            "train_ex_per_s": statistics.fmean(d["train_examples_per_s"] or 0.0 for d in later),
            "wall_s": statistics.fmean(d["wall"] for d in later),
            "auc": statistics.fmean(a) if (a := [d["auc"] for d in later if d["auc"] is not None]) else None,
            "rank_peak_mib": mib(run["peak_rss"].get("rank", 0)),
        }

    table = []
    for n in sorted(runs):
        if not any(k[0] == n for k in others):
            continue
        cfg = RunConfig()
        base = row(n, f"{cfg.store.row_format(cfg.optim.sparse_optimizer).name} (default)", runs[n])
        base |= {"train_ex_per_s vs_default": 1.0, "wall vs_default": 1.0}
        table.append(base)
        for (m, f), run in others.items():
            if m == n:
                r = row(n, f, run)
                r |= {
                    "train_ex_per_s vs_default": r["train_ex_per_s"] / base["train_ex_per_s"],
                    "wall vs_default": r["wall_s"] / base["wall_s"],
                }
                table.append(r)
    return table


def print_report(runs: dict[int, dict[str, Any]], refs: dict[int, dict[str, Any]], summary: dict[str, Any]) -> None:
    per_day = [
        {
            "rows": d["rows"],
            "day": d["day"],
            **{p: d["seconds"].get(p, 0.0) for p in PARTS},
            "wall": d["wall"],
            "train share": d["train_share"],
            "eval rows/s": (d["evaluate"] or {}).get("rows_per_s", 0.0),
            "train ex/s": d["train_examples_per_s"],
            "train mfu": d.get("train_mfu"),
        }
        for n in sorted(runs)
        for d in runs[n]["days"]
    ]
    print("\n== bench.day: seconds per day ==")
    print_table(per_day)
    print("\n== per part, days 2.. (s, share of the day, CPU s of the process tree; growth exponent) ==")
    print_table(summary["parts"])
    print("\n== peak RSS per process kind (MiB) ==")
    print_table([{"rows": n, **{k: mib(runs[n]["peak_rss"].get(k, 0)) for k in KINDS}} for n in sorted(runs)])
    if refs:
        print("\n== bare-minimum reference (pyarrow CSV->Parquet + plain PyTorch loop) ==")
        print_table(
            [
                {"rows": n, **r, "our day": summary["walls"][n], "vs_reference": summary["vs_reference"][n]}
                for n, r in sorted(refs.items())
            ]
        )
    print("\n== goals ==")
    print_table([{"goal": g, "measured": m, "met": "yes" if ok else "NO"} for g, m, ok in summary["goals"]])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.day", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, action="append", help="rows per day (repeatable; default 1M and 5M)")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--no-reference", dest="reference", action="store_false")
    p.add_argument("--work", help="working folder (default: a fresh temporary one, removed afterwards)")
    p.add_argument(
        "--row-formats",
        nargs="*",
        default=[],
        help="other row formats (optimizer/row_dtype[/state_dtype], e.g. adam/fp32) whose backfill runs "
        "on the same days after the default's; table 'row formats' compares them with it",
    )
    add_smoke(p)
    args = apply_smoke(p.parse_args(argv), SMOKE)
    sizes = sorted(set(args.rows or [1_000_000, 5_000_000]))
    if args.days < 2:
        raise ValueError(
            f"--days must be >= 2 (day 1 trains cold; the goals are about the days after), got {args.days}"
        )
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-day-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        runs, refs = {}, {}
        for n in sizes:
            print(f"{n:,} rows/day x {args.days} days: ctrpipe backfill ...", flush=True)
            runs[n] = run_backfill(n, args.days, work)
            if args.reference:
                refs[n] = reference(runs[n], work)
        others = {(n, f): run_backfill(n, args.days, work, row_format=f) for n in sizes for f in args.row_formats}
        torch.set_num_threads(1)  # the rate a rank's one thread attains
        flops = add_mfu(runs, refs)
        summary = summarise(runs, refs)
        print_report(runs, refs, summary)
        formats = compare_formats(runs, others)
        if formats:
            print("\n== row formats: the same days with other rows (days 2..; vs_default = this / the default's) ==")
            print_table(formats)
        first = next(iter(flops.values()))
        print(
            f"train mfu: examples/s per rank x {first['flops_per_example'] / 1e6:.2f} MFLOP/example / "
            + ", ".join(
                f"{p['attainable_gflops']:.1f} GFLOP/s (fp32 matmul {p['matmul_shape']})" for p in flops.values()
            )
            + ", 1 thread, this run"
        )
        for run in (*runs.values(), *others.values()):
            del run["raw"], run["root"]
        path = write_json(
            "day",
            {
                "benchmark": "day",
                "params": {"rows": sizes, "days": args.days, "recipe": "default", "smoke": args.smoke},
                "flops": flops,
                "runs": {str(n): r for n, r in runs.items()},
                "reference": {str(n): r for n, r in refs.items()},
                "row_formats": {"runs": {f"{n} {f}": r for (n, f), r in others.items()}, "table": formats},
                "summary": {
                    **summary,
                    "goals": [{"goal": g, "measured": m, "met": ok} for g, m, ok in summary["goals"]],
                },
            },
        )
        print(f"results: {path}")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
