"""HET cache: sparse bytes, speed, hit rate and AUC for staleness bounds 0, 1, 10, 100 on 2 and 4 gloo ranks.

    python -m bench.het [--rows 60000] [--batch 256] [--procs 2,4] [--bounds 0,1,10,100] [--smoke]

Data: synthetic Criteo-shaped rows (`pipeline.generate`, via
`bench.train.write_synthetic_features`); every run trains one epoch on the
same train rows with `trainer.launch.torchrun.run_training` (torchrun, gloo, CPU, one
thread per process) and is scored on the same eval rows (`evaluate_model`).

Per run: sparse bytes per step moved between ranks (keys, rows, pushed
gradients and clock checks, from model.json's train stats), what the
synchronous path would have moved for the same keys (`uncached`), training
steps/s, the cache's hit rate (hits / remote rows looked up), and AUC.  Ratios
are against bound 0 (the synchronous path) at the same world size, in the same
run.  HET (VLDB 2022) reports the cache removing up to 88% of sparse traffic
at similar convergence.

Model: `bench.comm.MODEL`, a small attention model (the sparse traffic, not the dense network, is measured).
`--smoke`: 2 ranks, bounds 0 and 1, 2,000 rows (seconds; checks it runs).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench._common import add_smoke, apply_smoke, report, train_spec
from bench.comm import MODEL
from bench.train import write_synthetic_features
from storage.embedding.config import StoreConfig
from trainer.eval.scoring import evaluate_model
from trainer.launch.torchrun import run_training

SMOKE = {"rows": 2_000, "eval_rows": 500, "batch": 64, "procs": "2", "bounds": "0,1"}


def run_one(tmp: Path, features: Path, *, procs: int, bound: int, batch: int, dim: int) -> dict[str, Any]:
    """Train one epoch with `procs` ranks and staleness `bound`; returns the row of the table."""
    tag = f"w{procs}b{bound}"
    out = tmp / "runs" / tag / "model"
    spec = train_spec(
        features,
        out,
        tmp / "local" / tag,
        store=StoreConfig(embedding_dim=dim, init_std=0.01, host_budget_mb=256),
        model=MODEL,
        run_tag=tag,
        backend="gloo",
        device="cpu",
        nproc_per_node=procs,
        batch_size=batch,
        epochs=1,
        timeout_s=1800,
        log_every=10_000,
        checkpoint_every=0,
        staleness_bound=bound,
        lr=1e-3,
        sparse_lr=2e-2,
    )
    res = run_training(spec, work_dir=str(tmp / "work"))
    t, st = res.train, res.train.stats
    kinds = st.get("sparse_bytes_per_step_by_kind", {})
    return {
        "procs": procs,
        "bound": bound,
        "steps": t.steps,
        "sparse_KB_per_step": st["sparse_bytes_per_step"] / 1024,
        "uncached_KB_per_step": st.get("sparse_bytes_per_step_uncached", 0.0) / 1024,
        **{f"{k}_KB": v / 1024 for k, v in kinds.items()},
        "steps_per_s": t.steps / t.train_s if t.train_s else 0.0,
        "hit_rate": st.get("stale_cache_hit_rate", 0.0),
        "auc": evaluate_model(str(out), str(features))["auc"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.het", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=60_000)
    p.add_argument("--eval-rows", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=256, help="examples per step per rank")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--procs", default="2,4")
    p.add_argument("--bounds", default="0,1,10,100")
    add_smoke(p)
    args = apply_smoke(p.parse_args(argv), SMOKE)
    torch.set_num_threads(1)
    bounds = [int(b) for b in args.bounds.split(",")]
    if bounds[0] != 0:
        bounds = [0, *bounds]  # the ratios need the synchronous run
    tmp = Path(tempfile.mkdtemp(prefix="bench-het-"))
    rows: list[dict[str, Any]] = []
    try:
        features = write_synthetic_features(tmp / "features", args.rows, eval_rows=args.eval_rows)
        for procs in [int(x) for x in args.procs.split(",")]:
            base: dict[str, Any] = {}
            for bound in bounds:
                r = run_one(tmp, features, procs=procs, bound=bound, batch=args.batch, dim=args.dim)
                base = base or r
                r["bytes_vs_b0"] = r["sparse_KB_per_step"] / base["sparse_KB_per_step"]
                r["speed_vs_b0"] = r["steps_per_s"] / base["steps_per_s"]
                r["auc_minus_b0"] = r["auc"] - base["auc"]
                rows.append(r)
        report(
            "het",
            rows,
            params={
                "rows": args.rows,
                "eval_rows": args.eval_rows,
                "batch_per_rank": args.batch,
                "dim": args.dim,
                "bounds": bounds,
                "model": str(MODEL),
            },
            notes="bytes: between ranks only (a rank's own keys never leave it), sent + received, all ranks; "
            "uncached: what bound 0 moves for the same keys; hit_rate: cache hits / remote rows looked up; "
            "gloo on one machine, so steps/s measures CPU cost, not a network",
            columns=[
                "procs",
                "bound",
                "steps",
                "sparse_KB_per_step",
                "bytes_vs_b0",
                "uncached_KB_per_step",
                "pull_keys_KB",
                "pull_rows_KB",
                "push_KB",
                "clock_KB",
                "hit_rate",
                "steps_per_s",
                "speed_vs_b0",
                "auc",
                "auc_minus_b0",
            ],
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
