"""Negative sampling on rare positives (issue 52): later-day AUC, log loss, calibration and train time at keep-rates.

A rare-positive sample of the shared Criteo head: every negative and a seeded 2% of the positives (about 0.5%
positives), in file order; its first 80% is one training day, the rest the later day.  Each keep-rate
(`optim.negative_sampling`) trains that day through the product (`flows.day.run.run_day`, the default config but
the keep-rate), and the day's model scores the later day.  Each replicate draws other positives and seeds the
model: the differences to keep-rate 1 are paired within a replicate, and their sd is over replicates.
Calibration is mean score / click rate; `uncorrected` is that of the scores without the log(w) correction.
`train_s` is the train stage (with the torchrun launch), `fit_s` the training loop alone.

    python -m bench.rare_positives [--replicates 3] [--keep-rates 1.0 0.25 0.1] [--smoke]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

KEEP_POSITIVES = 0.02
TRAIN_SHARE = 0.8


def rare_sample(out: Path, *, seed: int, rows: int, data: Path) -> Any:
    """Day files (`bench.quality_data.DayFiles`) of the first `rows` Criteo rows with every negative and a seeded
    `KEEP_POSITIVES` of the positives: one training day, then the later day."""
    from bench.quality_data import real_days

    lines = (data / "criteo" / "train_head_10k.tsv").read_text().splitlines(keepends=True)[:rows]
    draw = np.random.default_rng(seed).random(len(lines))
    kept = [line for line, u in zip(lines, draw, strict=True) if line[0] == "0" or u < KEEP_POSITIVES]
    (out / "data" / "criteo").mkdir(parents=True)
    (out / "data" / "criteo" / "train_head_10k.tsv").write_text("".join(kept))
    n_train = round(len(kept) * TRAIN_SHARE)
    return real_days("criteo", out / "days", data=out / "data", counts=(n_train, len(kept) - n_train))


def one_run(files: Any, root: Path, *, keep_rate: float, seed: int) -> dict[str, Any]:
    """Train the day at `keep_rate` through the product and score the later day with that day's model."""
    from bench._common import Variant
    from bench.quality_product import product_config
    from flows.cli.evaluate_file import score_log
    from flows.day.run import run_day
    from trainer.eval.metrics import auc, logloss

    variant = Variant(f"w={keep_rate:g}", {"optim.negative_sampling": keep_rate})
    cfg = product_config(files, root, arch="attention", seed=seed, variant=variant)
    record = run_day(cfg, files.train_dates[0]).record
    if record.model_version is None:
        raise RuntimeError(f"keep-rate {keep_rate}: the day trained no model ({record.status}: {record.reason})")
    y, q = score_log(cfg, record.model_version, files.later, files.fmt)
    raw = 1 / (1 + np.exp(-(np.log(q / (1 - q)) - math.log(keep_rate))))  # the scores before the correction
    return {
        "keep_rate": keep_rate,
        "auc": auc(y, q),
        "logloss": logloss(y, q),
        "calibration": float(q.mean() / y.mean()),
        "uncorrected": float(raw.mean() / y.mean()),
        "train_s": record.seconds.get("train"),
        "fit_s": record.train["examples"] / record.train["examples_per_s"],  # the loop alone, no launch
        "examples": record.train.get("examples"),
        "sampled_out": record.train.get("sampled_out", 0),
        "status": record.status,
        "later_rows": len(y),
        "later_clicks": int(y.sum()),
    }


def summarize(runs: list[dict[str, Any]], keep_rates: list[float]) -> list[dict[str, Any]]:
    """One row per keep-rate: means over replicates, and the paired differences to the first keep-rate."""
    rows = []
    for w in keep_rates:
        mine = [r for r in runs if r["keep_rate"] == w]
        base = [r for r in runs if r["keep_rate"] == keep_rates[0]]
        row: dict[str, Any] = {"keep_rate": w, "replicates": len(mine)}
        for key in ("auc", "logloss", "calibration", "uncorrected", "train_s", "fit_s", "examples"):
            row[key] = statistics.fmean(r[key] for r in mine)
        for key in ("auc", "logloss", "calibration"):
            diffs = [m[key] - b[key] for m, b in zip(mine, base, strict=True)]
            row[f"{key}_vs_1"] = statistics.fmean(diffs)
            row[f"{key}_vs_1_sd"] = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
        row["clicks"] = sum(r["later_clicks"] for r in mine)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rare_positives", description=__doc__.splitlines()[0])
    p.add_argument("--replicates", type=int, default=3, help="positive subsets (and model seeds) to pair over")
    p.add_argument("--keep-rates", nargs="*", type=float, default=[1.0, 0.25, 0.1])
    p.add_argument("--rows", type=int, default=10_000, help="rows of the Criteo head to sample from")
    p.add_argument("--out", default="rare_positives")
    from bench._common import add_smoke, apply_smoke, print_table, write_json
    from bench.quality_data import DATA

    add_smoke(p)  # one replicate of 3,000 rows at two keep-rates
    args = apply_smoke(p.parse_args(argv), {"replicates": 1, "keep_rates": [1.0, 0.25], "rows": 3_000})
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-rare-") as tmp:
        for r in range(args.replicates):
            files = rare_sample(Path(tmp) / f"r{r}", seed=r, rows=args.rows, data=DATA)
            runs += [
                {"replicate": r, **one_run(files, Path(tmp) / f"r{r}" / f"w{w:g}", keep_rate=w, seed=r)}
                for w in args.keep_rates
            ]
    rows = summarize(runs, args.keep_rates)
    print_table(
        rows,
        ["keep_rate", "auc", "auc_vs_1", "auc_vs_1_sd", "logloss", "calibration", "uncorrected", "train_s", "fit_s"],
    )
    print("later-day metrics of the day's model; *_vs_1: paired difference to keep-rate 1, sd over replicates")
    payload = {"rows": rows, "runs": runs, "params": vars(args)}
    print(f"results: {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
