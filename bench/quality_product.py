"""The product path as `bench.quality` and `bench.quality_rolling` run it: the run config a user's backfill has
(`product_config`), every training day through `flows.day.run.run_day` and LATEST scored on the later day
(`run_product`), and what the tables keep of each day and model (`day_summary`, `train_seconds`, `model_name`).

Both protocols train the same product the same way; this module is the part they share, so `bench.quality_rolling`
needs nothing of `bench.quality` (which runs it for `--protocol rolling`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench._common import Variant


def product_config(files: Any, root: Path, *, arch: str, seed: int, variant: Variant | None = None) -> Any:
    """The run config a user's `ctrpipe backfill` of `files` has, with the seed and the architecture named (and
    a variant's keys, e.g. another row format, when one is asked for)."""
    from flows.config import RunConfig, with_overrides

    sets: dict[str, Any] = {
        "root": str(root),
        "input.url": files.url,
        "input.format": files.fmt,
        "optim.seed": seed,
        "model.arch": arch,
        "dask.processes": False,
        "dask.n_workers": 1,  # operational: the same result with any cluster
    }
    return with_overrides(RunConfig(), sets | (variant.sets if variant else {}))


def model_name(arch: str, variant: Variant | None) -> str:
    """A model's name in the tables: the arch, and the variant's label in brackets."""
    return arch if variant is None else f"{arch} [{variant.label}]"


def run_product(files: Any, root: Path, *, arch: str, seed: int, variant: Variant | None = None) -> dict[str, Any]:
    """Every training day through `run_day`, then LATEST on the later day: labels, probabilities, day records."""
    from flows.cli.evaluate_file import score_log
    from flows.day.run import run_day

    cfg = product_config(files, root, arch=arch, seed=seed, variant=variant)
    records = [run_day(cfg, date).record for date in files.train_dates]
    labels, probs = score_log(cfg, "latest", files.later, files.fmt)
    return {"labels": labels, "probs": probs, "days": [day_summary(r) for r in records]}


def day_summary(record: Any) -> dict[str, Any]:
    """What the tables keep of a day's record: its AUCs, rows, recipe, steps and train seconds."""
    return {
        "date": record.date,
        "status": record.status,
        "auc": record.auc,
        "next_day_auc": record.next_day_auc,
        "rows_train": record.rows_train,
        "recipe": record.train.get("recipe", {}).get("values"),
        "steps": record.train.get("steps"),
        "rows_carried": (record.train.get("parent_eval") or {}).get("rows", 0),
        "train_s": record.seconds.get("train"),
    }


def train_seconds(chains: list[list[dict[str, Any]]]) -> float | None:
    """The train stage's wall seconds summed over each chain's days (a product model's chains, one per seed),
    their mean (`train_s`: what a model costs to train, beside what it scores); None without chains."""
    per_chain = [sum(d.get("train_s") or 0.0 for d in days) for days in chains]
    return float(sum(per_chain) / len(per_chain)) if per_chain else None
