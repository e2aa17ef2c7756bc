"""The companion's solver against scikit-learn's liblinear, side by side: `python -m bench._companion_solver [--smoke]`.

The companion's Poly2 LR (`trainer.companion.poly2`) minimises liblinear's objective (C times the summed log loss plus
half the squared weights, the intercept penalised too) by its own truncated Newton method, on torch's sparse CSR
products.  scikit-learn's `LogisticRegression(solver="liblinear")` minimises the same one; it is the tests' oracle,
and not a runtime dependency.  This times both on the same real rows at the production settings:

- the rows: the first `ROWS` rows of each shared real sample (the first 4 days of `bench.quality --protocol rolling`,
  the fit rows of a small day's companion), as the companion makes its inputs (pairs of the values' own keys and
  dense buckets, 2^22 buckets, each key's count class: `trainer.companion.model.inputs`);
- C: the one the companion's cross-validation chooses on those rows (`fit_cv`);
- each solver from the ids to its weights (ours: numbering the buckets and building its design; liblinear: the
  scipy CSR of the same columns), at its production stop: ours tol 1e-4 of |g(0)|, liblinear tol 1e-4 scaled by
  min(pos, neg) / rows (`Poly2Config.tol`); and ours at liblinear's stop, for the time at equal loss;
- the loss each reaches, as its excess over the minimum (ours at tol 1e-9), relative to the minimum.

Rounds alternate the solvers (a shared machine's load falls on each); the table gives medians.  Ours runs on every
core torch has (`trainer.commit._every_core`: rank 0's fit takes the node's cores) and on one, liblinear on one (it
has no threads).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

ROWS = 8_000
"""Fit rows per sample: days 1-4 of the rolling benchmark's 5 days of 2,000 rows."""
ROUNDS = 3


def rows_of(name: str, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The companion's inputs (pair ids (n, P), log1p dense (n, d)) and labels of the first `n` rows of a sample."""
    import tempfile
    from pathlib import Path

    from bench.quality_data import real_days
    from bench.quality_peers import poly2_inputs, poly2_keys
    from pipeline.ingest.parse import read_log_file
    from pipeline.schema import get_schema
    from trainer.companion.key_counts import KeyCounts
    from trainer.companion.poly2 import Poly2Config

    with tempfile.TemporaryDirectory() as tmp:
        files = real_days(name, Path(tmp), counts=(n, 1))
        events = read_log_file(files.path(files.train_dates[0]), files.fmt)[0]
    schema = get_schema(files.fmt)
    counts = KeyCounts.of(poly2_keys(events, schema))
    ids, dense = poly2_inputs(events, schema, Poly2Config().bits, counts, fit_rows=True)
    return ids, dense, events["label"].to_numpy(np.float64)


def objective(C: float, z: np.ndarray, y: np.ndarray, weights: list[np.ndarray]) -> float:
    """liblinear's objective: C times the summed log loss of logits `z`, plus half the squared weights."""
    return float(C * (np.logaddexp(0.0, z) - y * z).sum() + 0.5 * sum(float(w @ w) for w in weights))


def ours(ids: np.ndarray, dense: np.ndarray, y: np.ndarray, C: float, tol: float) -> tuple[float, dict[str, Any]]:
    from trainer.companion.poly2 import Poly2Config, fit

    model = fit(ids, dense, y, C, config=Poly2Config(tol=tol, newton_steps=100))
    loss = objective(C, model.logits(ids, dense), y, [model.weights, model.dense_weights, np.array([model.bias])])
    done = model.convergence
    return loss, {"newton_steps": done.newton_steps if done else None}


def liblinear(ids: np.ndarray, dense: np.ndarray, y: np.ndarray, C: float, tol: float) -> tuple[float, dict[str, Any]]:
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression

    used, col = np.unique(ids, return_inverse=True)
    rows = np.repeat(np.arange(len(y)), ids.shape[1])
    onehot = sp.csr_matrix((np.ones(ids.size), (rows, col.ravel())), shape=(len(y), used.size))
    X = sp.hstack([onehot, sp.csr_matrix(dense)]).tocsr()
    ref = LogisticRegression(C=C, solver="liblinear", tol=tol, max_iter=100).fit(X, y)
    loss = objective(C, ref.decision_function(X), y, [ref.coef_[0], ref.intercept_])
    return loss, {"newton_steps": int(ref.n_iter_[0])}


def timed(run: Callable[[], tuple[float, dict[str, Any]]], threads: int) -> tuple[float, float, dict[str, Any]]:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t0 = time.perf_counter()
        loss, info = run()
        return time.perf_counter() - t0, loss, info
    finally:
        torch.set_num_threads(saved)


def measure(name: str, n: int, rounds: int) -> list[dict[str, Any]]:
    """Every solver's rows for one sample: median seconds over `rounds`, the loss's excess over the minimum."""
    from trainer.companion.poly2 import Poly2Config, fit_cv

    ids, dense, y = rows_of(name, n)
    C = fit_cv(ids, dense, y, config=Poly2Config())[0].C
    minimum = ours(ids, dense, y, C, 1e-9)[0]
    pos = int(y.sum())
    scaled = 1e-4 * max(min(pos, len(y) - pos), 1) / len(y)  # liblinear's stop, as this solver's tol
    cores = torch.get_num_threads()
    runs: dict[str, tuple[Callable[[], tuple[float, dict[str, Any]]], int]] = {
        f"ours (kept), tol 1e-4, {cores} threads": (lambda: ours(ids, dense, y, C, 1e-4), cores),
        "ours (kept), tol 1e-4, 1 thread": (lambda: ours(ids, dense, y, C, 1e-4), 1),
        f"ours at liblinear's stop (tol {scaled:.2g}), {cores} threads": (
            lambda: ours(ids, dense, y, C, scaled),
            cores,
        ),
        "scikit-learn liblinear, tol 1e-4 (its stop)": (lambda: liblinear(ids, dense, y, C, 1e-4), 1),
    }
    seen: dict[str, list[tuple[float, float, dict[str, Any]]]] = {k: [] for k in runs}
    for _ in range(rounds):
        for key, (run, threads) in runs.items():
            seen[key].append(timed(run, threads))
    return [
        {
            "dataset": name,
            "run": key,
            "rows": len(y),
            "C": C,
            "s": statistics.median(s for s, _, _ in got),
            "loss_excess_ppm": 1e6 * (got[0][1] - minimum) / minimum,
            "newton_steps": got[0][2]["newton_steps"],
        }
        for key, got in seen.items()
    ]


def main(argv: list[str] | None = None) -> int:
    from bench._common import add_smoke, print_table, write_json

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_smoke(p)
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--datasets", nargs="*", default=["criteo", "avazu"])
    args = p.parse_args(argv)
    rows, rounds, datasets = (1_000, 1, ["criteo"]) if args.smoke else (args.rows, args.rounds, args.datasets)
    table = [r for name in datasets for r in measure(name, rows, rounds)]
    print_table(table)
    print(
        "s: median wall seconds from the ids to the weights over the rounds; loss_excess_ppm: (loss - minimum) / "
        "minimum in millionths, the minimum ours at tol 1e-9; newton_steps: ours, or liblinear's n_iter_"
    )
    print(f"results: {write_json('companion_solver', {'rows': table, 'rounds': rounds})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
