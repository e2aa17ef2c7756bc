"""Rolling-origin quality on every shared real row: a difference of 0.005 decidable on the data the project has.

    python -m bench.quality --protocol rolling                      # criteo and avazu, 5 days, seed 0
    python -m bench.quality --protocol rolling --smoke              # 3 small Criteo days: a check that it runs
    python -m bench.quality --protocol rolling --no-peers --row-formats adam/fp32   # the rows' cost on quality

Each shared real sample (`bench.quality_data`) is cut by row order (time order) into `days` day files.
The product is what a user's backfill gives: `flows.day.run.run_day` on day 1, 2, ... with the default
config (`bench.quality_product.product_config`), each day warm-started from the one before; after day k the
registry's LATEST, the model a user serves, is scored on day k+1's file (`ctrpipe evaluate`'s
`score_log`).  So origin k trains on days 1..k and scores day k+1, and the scored rows of every
origin are pooled: days 2..K, 8,000 of the 10,000 Criteo rows, against the 2,000 of the later-day
protocol, whose paired sd (0.0038 there) is too wide to decide a 0.005 difference.

`--row-formats` and `--variants` run the default arch's chain again with each other row format or set of
config keys (each chain warm-started from day to day in its own root), on the same days; `--archs` without
`lr` leaves this project's `lr` arch out.

Peers, on the same splits and rows:
- this project's `lr` arch, through the same product path;
- scikit-learn LR on hashed one-hot values, refit at every origin on the rows of days 1..k, C chosen by
  an inner time split of those rows (`bench.quality_peers.sklearn_lr_time_split`);
- the same LR with every pair of a row's tokens hashed in (`sklearn-poly2`, Poly2), fit the same way;
- DeepCTR-Torch DeepFM with its defaults but the number of epochs, refit at every origin on the rows of
  days 1..k, its epochs chosen by an inner time split of those rows
  (`bench.quality_peers.deepctr_deepfm_time_split`; the chosen ones, per seed and origin, are in the
  result's `peers`, as the LR's C are).
Beside the peers, two rows that are not peers: `poly2`, this project's own Poly2 LR (`trainer.companion.poly2`,
no scikit-learn; the learner of the companion the product blends in on small days), on the companion's
inputs (the pairs and the train rows' key counts) with C chosen as the companion chooses it
(`bench.quality_peers.poly2_fit`); and a probe, `probe: attention + poly2`:
per seed, the mean of the default's and that Poly2's logits.  They measure what a second learner of another
kind adds to the default on these days (issue 31; docs/benchmarks.md).  Neither needs a peer package.
A peer whose package is not importable is skipped with a line saying so (`make bench-peers` installs them).

Each model's predictions of the pooled rows give its pooled AUC (and the per-origin AUCs and their mean,
`auc_origins`, which a model whose scale drifts between origins does not lose by); its
difference from the default model comes with the paired-bootstrap sd over the pooled rows
(`bench.quality_stats`).  An origin at which a product chain had no LATEST (every day so far
refused) serves nothing and is left out for every model, and listed.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import Variant

log = logging.getLogger("bench.quality")

OURS = "attention"
LR_ARCH = "lr"
ROLLING_DAYS = 5
"""Day files each real sample is cut into: 4 origins, 2,000 rows a day."""


@dataclass(frozen=True)
class RollingSize:
    days: int = ROLLING_DAYS
    rows: int | None = None
    """Rows of each sample used (its first ones); None = every row."""
    datasets: tuple[str, ...] = ("criteo", "avazu")
    seeds: tuple[int, ...] = (0,)
    lr_cs: tuple[float, ...] | None = None
    """The Cs the scikit-learn LR chooses from at each origin (None: `bench.quality_peers.LR_CS`)."""
    poly2_cs: tuple[float, ...] | None = None
    """The Cs the Poly2 LRs (`poly2`, `sklearn-poly2`) choose from (None: `bench.quality_peers.POLY2_CS`)."""
    deepfm_epochs: tuple[int, ...] | None = None
    """The epoch counts DeepFM chooses from (None: `bench.quality_peers.DEEPFM_EPOCHS`)."""


SMOKE = RollingSize(
    days=3, rows=3_300, datasets=("criteo",), lr_cs=(0.03, 0.1), poly2_cs=(0.001, 0.003), deepfm_epochs=(1, 2)
)
"""3 Criteo days of 1,100 rows (the gate needs min_eval_rows=100 eval rows, a tenth of a day): 2 origins; each peer
chooses its C (DeepFM its epochs) from two: a choice all the same, where the full grids fit each origin's rows 5-16
times."""


POLY2 = "sklearn-poly2"
OWN_POLY2 = "poly2"
"""Not a peer: this project's Poly2 LR (`trainer.companion.poly2`) on the companion's inputs, its C chosen as the
companion chooses it (`trainer.companion.poly2.fit_cv`)."""
BLEND = f"probe: {OURS} + {OWN_POLY2}"
"""Not a peer: the mean of the default's and `poly2`'s logits, a probe of what a second, different learner adds
to the default on these days (issue 31)."""


def blend(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The probabilities of `p` and `q` blended as the companion's scorer blends logits
    (`trainer.companion.model.blend`, their mean); probabilities clipped at 1e-7 from 0 and 1."""
    from trainer.companion.model import blend as blend_logits

    z = [np.log(np.clip(x, 1e-7, 1 - 1e-7)) - np.log1p(-np.clip(x, 1e-7, 1 - 1e-7)) for x in (p, q)]
    return 1 / (1 + np.exp(-blend_logits(z[0], z[1])))


def split_counts(rows: int, days: int) -> tuple[int, ...]:
    """`rows` cut into `days` consecutive parts of (almost) equal size, in row order.

    Raises:
        ValueError: fewer than 2 days, or fewer rows than days.
    """
    if days < 2 or rows < days:
        raise ValueError(f"a rolling split needs >= 2 days and at least one row a day, got {days} days of {rows} rows")
    edges = np.linspace(0, rows, days + 1).astype(int)
    return tuple(int(n) for n in np.diff(edges))


def _registry_latest(cfg: Any) -> str | None:
    from storage.io.registry import ModelRegistry

    return ModelRegistry(cfg.layout()).latest()


def product_chain(files: Any, root: Path, *, arch: str, seed: int, variant: Variant | None = None) -> dict[str, Any]:
    """`run_day` on every day but the last, LATEST after day k scored on day k+1: per origin, (labels, probs)
    or None when nothing was published yet, and each day's record.  A `variant` (e.g. another row format) sets
    its keys on every day; each day warm-starts from the day before in the same chain."""
    from bench.quality_product import day_summary, product_config
    from flows.cli.evaluate_file import score_log
    from flows.day.run import run_day

    cfg = product_config(files, root, arch=arch, seed=seed, variant=variant)
    dates = (*files.train_dates, files.later_date)
    scored: list[tuple[np.ndarray, np.ndarray] | None] = []
    days = []
    for date, after in zip(dates[:-1], dates[1:], strict=True):
        days.append(day_summary(run_day(cfg, date).record))
        scored.append(score_log(cfg, "latest", files.path(after), files.fmt) if _registry_latest(cfg) else None)
    return {"scored": scored, "days": days}


def _peer_missing(module: str) -> str | None:
    """Why a peer cannot run here (None when it can)."""
    if importlib.util.find_spec(module) is None:
        return f"{module} is not importable (make bench-peers)"
    return None


def run_rolling_dataset(
    name: str,
    work: Path,
    size: RollingSize,
    *,
    peers: bool = True,
    data: Path | None = None,
    variants: tuple[Variant, ...] = (),
    lr_arch: bool = True,
) -> dict[str, Any]:
    """Every model on one sample's rolling origins (this project's `lr` arch when `lr_arch`), and the default
    arch again with each of `variants`; returns the pooled results (JSON-ready)."""
    from bench.quality_data import DATA, real_days, real_rows
    from bench.quality_product import model_name, train_seconds
    from bench.quality_stats import paired_bootstrap_sd
    from pipeline.ingest.parse import read_log_file
    from trainer.eval.metrics import auc, logloss

    data = data or DATA
    total = real_rows(name, data=data)
    rows = min(total, size.rows or total)
    counts = split_counts(rows, size.days)
    files = real_days(name, work / "raw", data=data, counts=counts)
    dates = (*files.train_dates, files.later_date)
    origins = list(range(1, size.days))  # origin k: trained on days 1..k, scored on day k+1
    chains: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    runs: list[tuple[str, Variant | None]] = [(arch, None) for arch in ((OURS, LR_ARCH) if lr_arch else (OURS,))]
    for arch, variant in runs + [(OURS, v) for v in variants]:
        model = model_name(arch, variant)
        folder = arch if variant is None else f"{arch}-{variant.folder}"
        t0 = time.perf_counter()
        chains[model] = [
            product_chain(files, work / f"{folder}-{seed}", arch=arch, seed=seed, variant=variant)
            for seed in size.seeds
        ]
        seconds[model] = (time.perf_counter() - t0) / len(size.seeds)
        log.info("%s %s: %d days through run_day", name, model, size.days - 1)
    kept = [k for k in origins if all(c["scored"][k - 1] is not None for runs in chains.values() for c in runs)]
    dropped = [k for k in origins if k not in kept]
    if not kept:
        raise RuntimeError(f"{name}: no origin had a published model in every product chain: nothing to compare")
    day_rows = [read_log_file(files.path(d), files.fmt)[0] for d in dates]
    labels = np.concatenate([day_rows[k]["label"].to_numpy(np.float64) for k in kept])
    for arch, runs in chains.items():
        for c in runs:
            y = np.concatenate([c["scored"][k - 1][0] for k in kept])
            if not np.array_equal(y, labels):
                raise RuntimeError(f"{name} {arch}: the rows the product scored differ from the day files' rows")
    models: dict[str, list[np.ndarray]] = {
        arch: [np.concatenate([c["scored"][k - 1][1] for k in kept]) for c in runs] for arch, runs in chains.items()
    }
    skipped: dict[str, str] = {}
    info: dict[str, Any] = {}
    if peers:
        import pandas as pd

        from pipeline.schema import get_schema

        schema = get_schema(files.fmt)

        def each_origin(fit: Any) -> np.ndarray:
            return np.concatenate([fit(pd.concat(day_rows[:k], ignore_index=True), day_rows[k], k) for k in kept])

        from bench.quality_peers import poly2_fit

        def refit_each_origin(model: str, fit: Any) -> None:
            """`fit(train, later, schema) -> (probabilities, {"C": ...})` refit at every origin: its predictions,
            seconds and the C it chose at each origin."""
            chosen: list[float] = []

            def at_origin(train: Any, later: Any, k: int) -> np.ndarray:
                p, meta = fit(train, later, schema)
                chosen.append(meta["C"])
                return p

            t0 = time.perf_counter()
            models[model] = [each_origin(at_origin)]
            seconds[model], info[model] = time.perf_counter() - t0, {"C_per_origin": chosen}

        refit_each_origin(OWN_POLY2, functools.partial(poly2_fit, cs=size.poly2_cs))
        models[BLEND] = [blend(p, models[OWN_POLY2][0]) for p in models[OURS]]
        seconds[BLEND] = seconds[OWN_POLY2]
        if (why := _peer_missing("sklearn")) is None:
            from bench.quality_peers import sklearn_lr_time_split

            refit_each_origin("sklearn-lr", functools.partial(sklearn_lr_time_split, cs=size.lr_cs))
            refit_each_origin(POLY2, functools.partial(sklearn_lr_time_split, pairs=True, cs=size.poly2_cs))
        else:
            skipped["sklearn-lr"] = skipped[POLY2] = why
        if (why := _peer_missing("deepctr_torch")) is None:
            from bench.quality_peers import DEEPFM_EPOCHS, deepctr_deepfm_time_split

            deepfm_epochs = size.deepfm_epochs or DEEPFM_EPOCHS

            def deepfm(seed: int) -> tuple[np.ndarray, list[int]]:
                epochs: list[int] = []

                def fit(train: Any, later: Any, k: int) -> np.ndarray:
                    p, meta = deepctr_deepfm_time_split(train, later, schema, seed=seed, epochs=deepfm_epochs)
                    epochs.append(meta["epochs"])
                    return p

                return each_origin(fit), epochs

            t0 = time.perf_counter()
            fits = [deepfm(s) for s in size.seeds]
            models["deepctr-deepfm"] = [p for p, _ in fits]
            seconds["deepctr-deepfm"] = (time.perf_counter() - t0) / len(size.seeds)
            info["deepctr-deepfm"] = {
                "epochs_per_origin": [e for _, e in fits],
                "seeds": list(size.seeds),
                "epochs_tried": list(deepfm_epochs),
            }
        else:
            skipped["deepctr-deepfm"] = why
    for peer, why in skipped.items():
        print(f"{name}: {peer} skipped: {why}")
    bounds = np.cumsum([0] + [counts[k] for k in kept])
    table = []
    for model, runs in models.items():
        per_origin = [
            float(np.mean([auc(labels[a:b], p[a:b]) for p in runs]))
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)
        ]
        row: dict[str, Any] = {
            "dataset": name,
            "model": model,
            "seeds": len(runs),
            "auc": float(np.mean([auc(labels, p) for p in runs])),
            "logloss": float(np.mean([logloss(labels, p) for p in runs])),
            "calib": float(np.mean([p.mean() / labels.mean() for p in runs])),
            "auc_per_origin": per_origin,
            "auc_origins": float(np.mean(per_origin)),
            "s": seconds[model],
        }
        if model in chains:  # the product's chains: their train stages' seconds
            row["train_s"] = train_seconds([c["days"] for c in chains[model]])
        if model != OURS:
            row["vs_default"] = row["auc"] - float(np.mean([auc(labels, p) for p in models[OURS]]))
            row["vs_sd"] = paired_bootstrap_sd(labels, runs, models[OURS])
            row["decided"] = "yes" if abs(row["vs_default"]) > 2 * row["vs_sd"] else "no"
        table.append(row)
    return {
        "rows": table,
        "skipped": skipped,
        "peers": info,
        "split": {
            "days": size.days,
            "rows_per_day": list(counts),
            "rows_used": rows,
            "rows_in_sample": total,
            "origins": kept,
            "origins_without_a_model": dropped,
            "pooled_rows": int(labels.size),
        },
        "days": {arch: [c["days"] for c in runs] for arch, runs in chains.items()},
    }
