"""The companion's C by today's folds or by forward-chaining ones, on the rolling origins:
`python -m bench._companion_folds [--smoke]`.

`trainer.companion.poly2.fit_cv` chooses the companion's C by cross-validation of its fit rows, in time order.
`blocks` (today's): each of 3 blocks scored by a fit of the other two, the later rows included; `forward`: 4 blocks,
each of the last 3 scored by a fit of the blocks before it alone, as the companion is used.  This runs
`bench.quality --protocol rolling`'s origins on the companion alone, as its `poly2` row does
(`bench.quality_peers.poly2_fit`): each shared real sample cut by row order into 5 days of 2,000 rows; at origin k
the companion is fit on days 1..k (its inputs, its C chosen from the product's grid by each cv) and scores day k+1.
The pooled AUC of days 2..5, the paired-bootstrap sd of forward - blocks over those rows
(`bench.quality_stats`), the C each chose at every origin, and the seconds of the fits.  Where both choose the
same C at every origin, the product's companion (and so its blended scores) is the same whichever cv it runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CVS = ("blocks", "forward")
DAYS = 5


def origins(name: str, days: int, rows: int | None) -> tuple[list[Any], Any]:
    """The sample's day frames (row order) and its log schema."""
    from bench.quality_data import real_days, real_rows
    from bench.quality_rolling import split_counts
    from pipeline.ingest.parse import read_log_file
    from pipeline.schema import get_schema

    total = min(real_rows(name), rows or real_rows(name))
    with tempfile.TemporaryDirectory() as tmp:
        files = real_days(name, Path(tmp), counts=split_counts(total, days))
        frames = [read_log_file(files.path(d), files.fmt)[0] for d in (*files.train_dates, files.later_date)]
    return frames, get_schema(files.fmt)


def run(name: str, days: int, rows: int | None, cs: tuple[float, ...] | None) -> list[dict[str, Any]]:
    import pandas as pd

    from bench.quality_peers import POLY2_CS, poly2_inputs, poly2_keys
    from bench.quality_stats import paired_bootstrap_sd
    from trainer.companion.key_counts import KeyCounts
    from trainer.companion.poly2 import Poly2Config, fit_cv
    from trainer.eval.metrics import auc, logloss

    frames, schema = origins(name, days, rows)
    probs: dict[str, list[np.ndarray]] = {cv: [] for cv in CVS}
    chosen: dict[str, list[float]] = {cv: [] for cv in CVS}
    seconds = dict.fromkeys(CVS, 0.0)
    for k in range(1, days):
        train, later = pd.concat(frames[:k], ignore_index=True), frames[k]
        counts = KeyCounts.of(poly2_keys(train, schema))
        ids, dense = poly2_inputs(train, schema, Poly2Config().bits, counts, fit_rows=True)
        later_ids, later_dense = poly2_inputs(later, schema, Poly2Config().bits, counts)
        for cv in CVS:
            t0 = time.perf_counter()
            model, _ = fit_cv(
                ids, dense, train["label"].to_numpy(np.float64), config=Poly2Config(cs=cs or POLY2_CS, cv=cv)
            )
            seconds[cv] += time.perf_counter() - t0
            probs[cv].append(1 / (1 + np.exp(-model.logits(later_ids, later_dense))))
            chosen[cv].append(model.C)
    y = np.concatenate([f["label"].to_numpy(np.float64) for f in frames[1:]])
    pooled = {cv: np.concatenate(p) for cv, p in probs.items()}
    out = []
    for cv in CVS:
        row: dict[str, Any] = {
            "dataset": name,
            "cv": cv,
            "auc": auc(y, pooled[cv]),
            "logloss": logloss(y, pooled[cv]),
            "C_per_origin": chosen[cv],
            "fit_s": seconds[cv],
        }
        if cv != "blocks":
            row["vs_blocks"] = row["auc"] - auc(y, pooled["blocks"])
            row["vs_sd"] = paired_bootstrap_sd(y, [pooled[cv]], [pooled["blocks"]])
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    from bench._common import add_smoke, print_table, write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_smoke(p)
    p.add_argument("--datasets", nargs="*", default=["criteo", "avazu"])
    args = p.parse_args(argv)
    if args.smoke:  # 3 days of 1,100 Criteo rows, two Cs: a check that it runs
        table = run("criteo", 3, 3_300, (0.001, 0.003))
    else:
        table = [r for name in args.datasets for r in run(name, DAYS, None, None)]
    print_table(table)
    print("auc: pooled over days 2..5 (origin k fit on days 1..k); vs_sd: paired-bootstrap sd of vs_blocks")
    print(f"results: {write_json('companion_folds', {'rows': table, 'days': DAYS})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
