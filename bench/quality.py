"""Model quality of what `ctrpipe` gives a user: day files -> the daily flow -> LATEST -> a later day.

    python -m bench.quality                                   # criteo avazu synthetic-100k synthetic-1000k
    python -m bench.quality --datasets criteo avazu --archs attention lr --seeds 0 1 2
    python -m bench.quality --warm-start                      # a 7-day backfill vs day 7 alone, on day 8
    python -m bench.quality --datasets criteo --archs attention --no-peers --row-formats adam/fp32
    python -m bench.quality --protocol rolling               # every shared real row, rolling origin
    (bench.quality_rolling)
    python -m bench.quality --smoke                           # the rolling protocol's small form, for tests

For each dataset (`bench.quality_data`: the shared Criteo and Avazu samples as two training days and
a later day, or synthetic days with planted interactions), the product is what a user runs:
`flows.day.run.run_day` on each training day with the default config (`RunConfig()`: its recipe for
the day's size is derived by `trainer.plan.recipe`, as in `ctrpipe run`), training through torchrun,
then the registry's LATEST scored on the later day file as `ctrpipe evaluate` scores it
(`flows.cli.evaluate_file.score_log`).  The config names only the root, the day files, the seed
(`optim.seed`) and, for this project's reference architectures, `model.arch`; Dask runs in threads
of this process, which changes no result.

In the same run, on the same rows: the peers of `bench.quality_peers` (scikit-learn logistic
regression, C by cross-validation on the training days' rows; DeepCTR-Torch DeepFM with its
defaults), fit on every row of the training day files (the product holds the last tenth of the last
day out for its publish gate, so it trains on fewer; `sklearn-lr (train split)` fits those).  Real
samples run every `--archs`; a synthetic dataset runs the default architecture and the logistic
regression beside its ceiling (the AUC of the true probabilities) and `bench.quality_bound`'s fit of a
model of the generator's exact form (what the rows give a learner that knows the form; it needs no
peer).  Each model runs with every seed (liblinear has none: one fit); a row
reports the mean and spread over seeds, and its difference from the default model with the
paired-bootstrap sd of that difference over the later rows (`bench.quality_stats`): a difference
within 2 sd is one the sample cannot decide.

`--variants key=value[,key=value] ...` runs the default architecture again with each set of config keys (e.g.
`vocab.min_count=1`), a row `attention [vocab.min_count=1]` each, compared with the default like any model;
`--row-formats optimizer/row_dtype[/state_dtype] ...` is the variant of another row format
(`optim.sparse_optimizer`, `store.row_dtype`, `store.state_dtype` (fp32 when left out); e.g. `adam/fp32`, the
rows before compact rows), a row `attention [adam/fp32]` each.  Each row of the product also gives `train_s`,
its train stages' seconds: what its AUC costs.

Benchmark-only dependencies: `make bench-peers`.  Results: bench/results/<--out>.json.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

from bench._common import Variant, add_smoke
from bench.quality_product import model_name, product_config, run_product, train_seconds

ARCHS = ("attention", "lr", "dnn", "deepfm", "dcn_v2")
DATASETS = ("criteo", "avazu", "synthetic-100k", "synthetic-1000k")
INTERACTIONS = 8
"""Planted pairwise interactions of the synthetic datasets (`ctrpipe generate --interactions`)."""
OURS = "attention"
BOUND = "planted-form fit (bound)"
COLUMNS = (
    "dataset",
    "model",
    "seeds",
    "auc",
    "auc_sd",
    "logloss",
    "calib",
    "vs_default",
    "vs_sd",
    "decided",
    "of_ceiling",
    "train_s",
    "s",
)

log = logging.getLogger("bench.quality")


def variants_of(args: argparse.Namespace) -> tuple[Variant, ...]:
    """`--row-formats` and `--variants` as variants of the default architecture.

    Raises:
        ValueError: a variant is not `key=value[,key=value...]` or names a key the config does not have.
    """
    from flows.config import RunConfig, with_overrides

    out = tuple(Variant.row_format(f) for f in args.row_formats) + tuple(Variant.parse(v) for v in args.variants)
    for v in out:
        with_overrides(RunConfig(), v.sets)  # an unknown key or a bad value fails here, before hours of runs
    return out


def run_dataset(
    name: str,
    work: Path,
    *,
    archs: list[str],
    seeds: list[int],
    peers: bool,
    interactions: int,
    variants: tuple[Variant, ...] = (),
) -> tuple[list, dict]:
    """Every model on one dataset, and the default architecture again with each of `variants`; returns (table
    rows, raw results)."""
    import time

    import numpy as np

    from bench.quality_data import dataset_days
    from bench.quality_stats import paired_bootstrap_sd, summarize
    from trainer.eval.metrics import auc

    files = dataset_days(name, work / "raw", interactions=interactions)
    synthetic = files.truth is not None
    models: dict[str, list[np.ndarray]] = {}
    seconds: dict[str, float] = {}
    raw: dict[str, Any] = {}
    labels = None
    runs: list[tuple[str, Variant | None]] = [(arch, None) for arch in ([OURS] if synthetic else archs)]
    for arch, variant in runs + [(OURS, v) for v in variants]:
        model = model_name(arch, variant)
        for seed in seeds:
            t0 = time.perf_counter()
            folder = work / (f"{arch}-{seed}" if variant is None else f"{arch}-{variant.folder}-{seed}")
            r = run_product(files, folder, arch=arch, seed=seed, variant=variant)
            seconds[model] = seconds.get(model, 0.0) + (time.perf_counter() - t0) / len(seeds)
            labels = r["labels"]
            models.setdefault(model, []).append(r["probs"])
            raw.setdefault(model, []).append({"seed": seed, "auc": auc(labels, r["probs"]), "days": r["days"]})
            log.info("%s %s seed %d: later-day AUC %.4f", name, model, seed, raw[model][-1]["auc"])
    if peers or synthetic:  # the day files parsed once, for the peers and the planted-form fit
        train, later = files.train_events(), files.later_events()
        if not np.array_equal(later["label"].to_numpy(np.float64), labels):
            raise RuntimeError(f"{name}: the later rows the references fit differ from the rows the product scored")
    if peers:
        from bench.quality_peers import deepctr_deepfm, sklearn_lr

        t0 = time.perf_counter()
        p, info = sklearn_lr(train, later, _schema(files.fmt))
        models["sklearn-lr"], seconds["sklearn-lr"], raw["sklearn-lr"] = [p], time.perf_counter() - t0, info
        if not synthetic:
            from flows.config import RunConfig

            t0 = time.perf_counter()
            p, info = sklearn_lr(files.train_split_events(RunConfig().encode.eval_fraction), later, _schema(files.fmt))
            key = "sklearn-lr (train split)"
            models[key], seconds[key], raw[key] = [p], time.perf_counter() - t0, info
            t0 = time.perf_counter()
            models["deepctr-deepfm"] = [deepctr_deepfm(train, later, _schema(files.fmt), seed=s)[0] for s in seeds]
            seconds["deepctr-deepfm"] = (time.perf_counter() - t0) / len(seeds)
    if synthetic:  # what a model of the generator's exact form gets from these rows
        from bench.quality_bound import planted_form_fit

        p, info = planted_form_fit(train, later, seed=files.seed, interactions=interactions)
        models[BOUND], seconds[BOUND], raw[BOUND] = [p], info.pop("s"), info
    ceiling = auc(labels, files.truth) if synthetic else None
    rows = []
    if synthetic:
        rows.append(
            {
                "dataset": name,
                "model": "truth (ceiling)",
                "seeds": 1,
                **summarize(labels, [files.truth]),
                "of_ceiling": 1.0,
            }
        )
    ours = summarize(labels, models[OURS])["auc"]
    for model, runs in models.items():
        row = {"dataset": name, "model": model, "seeds": len(runs), **summarize(labels, runs), "s": seconds[model]}
        if isinstance(raw.get(model), list):  # the product's chains: their train stages' seconds
            row["train_s"] = train_seconds([r["days"] for r in raw[model]])
        if model != OURS:
            row["vs_default"] = row["auc"] - ours
            row["vs_sd"] = paired_bootstrap_sd(labels, runs, models[OURS])
            row["decided"] = "yes" if abs(row["vs_default"]) > 2 * row["vs_sd"] else "no"
        if ceiling:
            row["of_ceiling"] = row["auc"] / ceiling
        rows.append(row)
    return rows, {
        "files": {"train_dates": files.train_dates, "later": files.later_date, "rows": len(labels)},
        "runs": raw,
    }


def _schema(fmt: str) -> Any:
    from pipeline.schema import get_schema

    return get_schema(fmt)


def warm_start_check(work: Path, *, days: int, rows_per_day: int, interactions: int, seed: int) -> list[dict[str, Any]]:
    """A `days`-day backfill (each day warm-started from the one before) against a model of its last day
    alone, both scored on the day after; the next-day AUC each day's record holds; and LATEST after
    each day scored on that same later day (days differ in difficulty, so only a fixed day shows the
    warm start's trend)."""
    from bench.quality_data import DayFiles
    from flows.cli.evaluate_file import score_log
    from flows.day.run import run_day
    from pipeline.generate import generate_days
    from trainer.eval.metrics import auc

    gen = generate_days(str(work / "raw"), days + 1, rows_per_day, seed=0, interactions=interactions, with_truth=True)
    files = DayFiles(
        "warm-start", "criteo", str(work / "raw" / "day_{date}.tsv.gz"), tuple(d.date for d in gen[:-1]), gen[-1].date
    )
    later = files.later
    rows = []
    chain = product_config(files, work / "backfill", arch=OURS, seed=seed)
    for date in files.train_dates:
        record = run_day(chain, date).record
        y, p = score_log(chain, "latest", later, "criteo")
        rows.append(
            {
                "model": f"backfill day {date}",
                "auc": record.auc,
                "next_day_auc": record.next_day_auc,
                "later_auc": auc(y, p),
                "status": record.status,
            }
        )
    y, p = score_log(chain, "latest", later, "criteo")
    rows.append({"model": f"backfill of {days} days, on {gen[-1].date}", "later_auc": auc(y, p)})
    alone = product_config(files, work / "alone", arch=OURS, seed=seed)
    run_day(alone, gen[-2].date)
    y, p = score_log(alone, "latest", later, "criteo")
    rows.append({"model": f"{gen[-2].date} alone, on {gen[-1].date}", "later_auc": auc(y, p)})
    import numpy as np

    truth = np.load(work / "raw" / f"day_{gen[-1].date}.truth.npy").astype(np.float64)
    rows.append({"model": f"truth (ceiling) on {gen[-1].date}", "later_auc": auc(y, truth)})
    return rows


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows for printing: AUC-like numbers with 4 decimals."""

    def cell(r: dict[str, Any], c: str) -> Any:
        v = r.get(c, "")
        return (f"{v:.0f}" if c == "s" else f"{v:.4f}") if isinstance(v, float) else v

    return [{c: cell(r, c) for c in columns} for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="*", default=list(DATASETS), help="criteo avazu synthetic-<N>k")
    p.add_argument("--archs", nargs="*", default=list(ARCHS), help="model.arch values run on the real samples")
    p.add_argument("--seeds", nargs="*", type=int, default=None, help="default 0 1 2 (--protocol rolling: 0)")
    p.add_argument("--interactions", type=int, default=INTERACTIONS, help="planted pairs of the synthetic data")
    p.add_argument("--no-peers", action="store_true", help="skip scikit-learn and DeepCTR-Torch")
    p.add_argument(
        "--warm-start", action="store_true", help="only the warm-start check: a backfill vs its last day alone"
    )
    p.add_argument("--days", type=int, default=7, help="days of the --warm-start backfill")
    p.add_argument("--rows-per-day", type=int, default=20_000, help="rows per day of the --warm-start backfill")
    p.add_argument(
        "--row-formats",
        nargs="*",
        default=[],
        help="other row formats to run the default architecture with, optimizer/row_dtype[/state_dtype] "
        "(e.g. adam/fp32, adam/int8/log8)",
    )
    p.add_argument(
        "--variants",
        nargs="*",
        default=[],
        help="other configs to run the default architecture with, each key=value[,key=value...] "
        "(e.g. vocab.min_count=1)",
    )
    p.add_argument(
        "--protocol",
        choices=("later-day", "rolling"),
        default="later-day",
        help="later-day: two training days, one later day; rolling: every real row, rolling origin",
    )
    p.add_argument(
        "--rolling-days",
        type=int,
        default=None,
        help="day files each real sample is cut into for --protocol rolling (default 5)",
    )
    add_smoke(p)  # the rolling protocol on 3 small Criteo days (tests/bench/test_smoke.py)
    p.add_argument("--out", default="quality")
    p.add_argument("--work", default=None, help="folder for the runs (default: a temporary one, removed)")
    args = p.parse_args(argv)
    try:
        variants = variants_of(args)
    except ValueError as e:
        p.error(str(e))
    if args.smoke:
        args.protocol = "rolling"
    if args.seeds is None:
        args.seeds = [0] if args.protocol == "rolling" else [0, 1, 2]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("trainer", "storage", "ctrpipe", "distributed", "pipeline", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from bench._common import print_table, write_json

    with tempfile.TemporaryDirectory(prefix="bench-quality-", dir=args.work) as tmp:
        work = Path(tmp)
        if args.protocol == "rolling":
            return rolling(args, work, variants)
        if args.warm_start:
            rows = warm_start_check(
                work, days=args.days, rows_per_day=args.rows_per_day, interactions=args.interactions, seed=args.seeds[0]
            )
            print_table(_table(rows, ("model", "auc", "next_day_auc", "later_auc", "status")))
            print(f"results: {write_json(args.out + '-warm-start', {'rows': rows, 'params': vars(args)})}")
            return 0
        rows, raw = [], {}
        for name in args.datasets:
            r, x = run_dataset(
                name,
                work / name,
                archs=args.archs,
                seeds=args.seeds,
                peers=not args.no_peers,
                interactions=args.interactions,
                variants=variants,
            )
            rows += r
            raw[name] = x
            print_table(_table(r, COLUMNS))
    print_table(_table(rows, COLUMNS))
    print(
        "auc: mean over seeds on the later day; auc_sd: sd over seeds; vs_default: auc minus the default model's; "
        "vs_sd: paired-bootstrap sd of that difference over the later rows; decided: |vs_default| > 2 vs_sd; train_s: "
        "the train stages' wall seconds over the training days (mean over seeds); s: the whole run's"
    )
    print(f"results: {write_json(args.out, {'rows': rows, 'params': vars(args), 'raw': raw})}")
    return 0


def rolling(args: argparse.Namespace, work: Path, variants: tuple[Variant, ...] = ()) -> int:
    """`--protocol rolling`: `bench.quality_rolling` on the real samples named (default both), or its smoke size."""
    import dataclasses

    from bench._common import print_table, write_json
    from bench.quality_rolling import LR_ARCH, SMOKE, RollingSize, run_rolling_dataset

    size = SMOKE if args.smoke else RollingSize()
    given = (
        {"datasets": tuple(d for d in args.datasets if d in ("criteo", "avazu")), "seeds": tuple(args.seeds)}
        if not args.smoke
        else {}
    )
    if args.rolling_days:
        given["days"] = args.rolling_days
    size = dataclasses.replace(size, **given)
    results = {
        name: run_rolling_dataset(
            name, work / name, size, peers=not args.no_peers, variants=variants, lr_arch=LR_ARCH in args.archs
        )
        for name in size.datasets
    }
    rows = [r for res in results.values() for r in res["rows"]]
    print_table(_table(rows, ROLLING_COLUMNS))
    print(
        "auc: pooled over the origins' scored days (each model refit or retrained at every origin); auc_origins: "
        "the mean of the origins' AUCs; vs_sd: "
        "paired-bootstrap sd of vs_default over the pooled rows; decided: |vs_default| > 2 vs_sd; train_s: the train "
        "stages' wall seconds over a chain's days (mean over seeds)"
    )
    payload = {
        "protocol": "rolling",
        "size": dataclasses.asdict(size),
        "datasets": results,
        "rows": rows,
        "params": vars(args),
    }
    print(f"results: {write_json(args.out, payload)}")
    return 0


ROLLING_COLUMNS = (
    "dataset",
    "model",
    "seeds",
    "auc",
    "auc_origins",
    "logloss",
    "calib",
    "vs_default",
    "vs_sd",
    "decided",
    "train_s",
    "s",
)


if __name__ == "__main__":
    raise SystemExit(main())
