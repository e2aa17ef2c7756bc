"""Run every benchmark at a small size, one after another: `python -m bench` (or `make bench`);
`python -m bench --smoke` runs each at its smoke size instead (seconds each: checks they all run).

Each benchmark is also a command of its own with full-size defaults:

    python -m bench.ingest  [--rows N ...] [--plain] [--repeat K]  ingest vs pyarrow CSV->Parquet, worker memory
    python -m bench.vocab   [--rows N] [--days 7]        vocabulary window, incremental vs from scratch
    python -m bench.store   [--quick] [--parts ...]      key index, host gathers, SSD I/O, hit rates, 10^6..10^8 keys
    python -m bench.train   [--rows N] [--procs ...]     default model: examples/s, MFU vs a plain PyTorch loop,
    TorchRec
    python -m bench.dense_step [--rows N ...]       the dense step alone: MFU, the attention's CPU kernel vs autograd
    python -m bench.comm    [--steps N] [--ks ...]       flat vs two-phase allreduce; k-step Adam sync cost and AUC
    python -m bench.het     [--procs 2,4] [--bounds ...] HET cache: sparse bytes/step, hit rate, AUC per staleness bound
    python -m bench.quality [--datasets ...] [--seeds ...] AUC/logloss vs sklearn LR, DeepFM; ceiling, planted-form
    bound
    python -m bench.day     [--rows N ...] [--days 3]    the day through `ctrpipe backfill`: per stage, vs a bare script
    python -m bench.rare_positives [--replicates 3]       negative sampling on rare positives: AUC, calibration, time
    python -m bench.bigday  [--rows N] [--keys K] [--budget-mb B] a day mostly on SSD vs all in memory, disk limit
    python -m bench.capacity                             a terabyte day on paper, from bench/results/*.json
    python -m bench.gpu_probe --out probe.json           the trainer's checks on a GPU (`make gpu-check`)

Every one but bench.quality and bench.serve also takes `--smoke` (tests/bench/test_smoke.py runs them so).
Results: a table on stdout and bench/results/<name>.json, or $BENCH_RESULTS_DIR (bench.day is not in the
quick run: it takes minutes even at its smallest).  Peers (scikit-learn, DeepCTR-Torch,
TorchRec) come from `make bench-peers`; a benchmark says so when one is missing.
"""

from __future__ import annotations

import subprocess
import sys

QUICK = [
    ["bench.ingest", "--rows", "200000", "--plain"],
    ["bench.vocab", "--rows", "100000", "--days", "7"],
    ["bench.store", "--quick"],
    ["bench.train", "--rows", "20000"],
    ["bench.dense_step", "--rows", "100000", "--rounds", "5"],
    ["bench.comm", "--steps", "100", "--sizes-mb", "1,4"],
    ["bench.het", "--rows", "8000", "--procs", "2", "--bounds", "0,10"],
    ["bench.quality", "--datasets", "criteo", "synthetic-20k", "--archs", "attention", "--seeds", "0"],
]


SMOKE = [
    "bench.ingest",
    "bench.vocab",
    "bench.store",
    "bench.train",
    "bench.dense_step",
    "bench.comm",
    "bench.het",
    "bench.day",
    "bench.bigday",
    "bench.serve",
    "bench.quality",
    "bench.quality_ladder",
    "bench.rare_positives",
    "bench.gpu_probe",
    "bench.capacity",
]
"""Every benchmark, each with a `--smoke` size, in the order `--smoke` runs them (capacity last: it reads the
others' results).  bench.quality_ladder needs scikit-learn (`make bench-peers`, or the test extra)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    runs = [[name, "--smoke"] for name in SMOKE] if argv == ["--smoke"] else QUICK
    if argv and argv != ["--smoke"]:
        print(f"usage: python -m bench [--smoke] (got {' '.join(argv)})", file=sys.stderr)
        return 2
    failed = []
    for args in runs:
        print(f"\n### python -m {' '.join(args)}", flush=True)
        if subprocess.run([sys.executable, "-m", *args]).returncode != 0:
            failed.append(args[0])
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
