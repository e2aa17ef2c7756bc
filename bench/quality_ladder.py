"""What daily training costs a logistic regression on the quality samples: `python -m bench.quality_ladder`.

`bench.quality` finds the product below a scikit-learn LR fit on every training row at once.  This
asks how much of that any daily trainer pays: one NumPy logistic regression on the same hashed
features, trained like the product's embedding rows (per-key Adam, batch 256, 3 passes, warm-up 4
steps, cosine decay to 0.1, embedding L2 0.1 on touched keys, bias from the click rate), moves one
step at a time from a batch fit's setting to the product's daily one:

1. every train row, shuffled each pass, one vocabulary (values seen twice over both days);
2. the same rows in time order;
3. without the last tenth of each day (the product's eval rows for its gate);
4. day by day: day 1's passes, then day 2's from day 1's weights and Adam state, each with its schedule;
5. a vocabulary per day (day 1 admits what day 1 saw twice; day 2 what days 1-2 saw twice);
6. day 1's eval tenth trained first on day 2, once its gate has used it (`trainer.plan.parent_eval`).

Row 6 at the sparse lr `trainer.plan.sparse_lr_search` chose is the LR the product could be, trained as
it trains; row 5 is the product before it trained its parent's eval rows.  Bench-only (scikit-learn's hasher, scipy):
`make bench-peers`.  Seconds per row.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from bench.quality_data import dataset_days
from bench.quality_peers import _categorical_text, _hashed
from pipeline.encode.split import eval_size
from pipeline.ingest.parse import read_log_file
from pipeline.schema import get_schema
from trainer.eval.metrics import auc

LRS = (0.0115, 0.023, 0.046)
EVAL_FRACTION = 0.1
BATCH, PASSES, WARMUP, L2, MIN_RATIO = 256, 3, 4, 0.1, 0.1
STEPS = (
    "1 all rows, shuffled, one vocab",
    "2 in time order",
    "3 without the eval tenths",
    "4 day by day",
    "5 a vocab per day",
    "6 + the parent's eval tenth (the product)",
)


@dataclass(frozen=True)
class Ladder:
    """The rows of one dataset, featurised for each vocabulary setting."""

    days: list[np.ndarray]
    """Row indices (into the train frame) of each training day."""
    kept: list[np.ndarray]
    """The same without the last EVAL_FRACTION of each day."""
    carried: list[np.ndarray]
    """What the product trains each day: the day before's eval rows (none on day 1), then the day's kept rows."""
    labels: np.ndarray
    later_labels: np.ndarray
    one_vocab: tuple
    """(train rows, later rows) as hashed sparse matrices, values admitted over both days."""
    per_day: tuple
    """The same with each day's rows encoded by the vocabulary of the days up to it."""


def _vocab(frame: pd.DataFrame, fields: tuple[str, ...]) -> dict[str, set]:
    return {c: set((vc := _categorical_text(frame, c).value_counts())[vc >= 2].index) for c in fields}


def _apply(frame: pd.DataFrame, vocab: dict[str, set]) -> pd.DataFrame:
    out = frame.copy()
    for c, keep in vocab.items():
        text = _categorical_text(frame, c)
        out[c] = text.where(text.isin(keep), "<rare>")
    return out


def build(name: str, work: Path) -> Ladder:
    files = dataset_days(name, work, interactions=8)
    schema = get_schema(files.fmt)
    frames = [read_log_file(files.path(d), files.fmt)[0] for d in files.train_dates]
    train, later = pd.concat(frames, ignore_index=True), files.later_events()
    starts = np.cumsum([0, *(len(f) for f in frames)])
    days = [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    kept = [d[: len(d) - eval_size(len(d), EVAL_FRACTION)] for d in days]
    held = [d[len(k) :] for d, k in zip(days, kept, strict=True)]
    carried = [kept[0], *(np.concatenate([h, k]) for h, k in zip(held, kept[1:], strict=False))]
    fields = tuple(schema.categorical)
    whole = _vocab(train, fields)
    # day k's rows are encoded with the vocabulary of days 1..k; the later day with the last one
    per_day_train = pd.concat(
        [_apply(f, _vocab(pd.concat(frames[: k + 1]), fields)) for k, f in enumerate(frames)], ignore_index=True
    )
    return Ladder(
        days,
        kept,
        carried,
        train["label"].to_numpy(float),
        later["label"].to_numpy(float),
        (_hashed(_apply(train, whole), schema), _hashed(_apply(later, whole), schema)),
        (_hashed(per_day_train, schema), _hashed(_apply(later, whole), schema)),
    )


def train_lr(x, y: np.ndarray, segments: list[np.ndarray], *, lr: float, shuffle: bool, seed: int = 0) -> tuple:
    """Per-key Adam over `segments` in turn (each its own PASSES and schedule, the weights and Adam state carried)."""
    d = x.shape[1]
    w, m, v, clock = np.zeros(d), np.zeros(d), np.zeros(d), np.zeros(d)
    rate = float(np.clip(y[np.concatenate(segments)].mean(), 1e-4, 1 - 1e-4))
    bias = float(np.log(rate / (1 - rate)))
    rng = np.random.default_rng(seed)
    for rows in segments:
        total, step = PASSES * -(-len(rows) // BATCH), 0
        for _ in range(PASSES):
            order = rng.permutation(rows) if shuffle else rows
            for lo in range(0, len(order), BATCH):
                idx = order[lo : lo + BATCH]
                xb, yb = x[idx], y[idx]
                step += 1
                t = (step - WARMUP) / max(1, total - WARMUP)
                at = (
                    lr * step / WARMUP
                    if step <= WARMUP
                    else lr * (MIN_RATIO + (1 - MIN_RATIO) * 0.5 * (1 + np.cos(np.pi * t)))
                )
                r = 1 / (1 + np.exp(-(xb @ w + bias))) - yb
                g = xb.T @ r / len(idx)
                touched = np.unique(xb.indices)
                g_t = g[touched] + L2 * w[touched] * np.asarray((xb[:, touched] != 0).sum(0)).ravel() / len(idx)
                clock[touched] += 1
                m[touched] = 0.9 * m[touched] + 0.1 * g_t
                v[touched] = 0.999 * v[touched] + 0.001 * g_t * g_t
                c = clock[touched]
                w[touched] -= at * (m[touched] / (1 - 0.9**c)) / (np.sqrt(v[touched] / (1 - 0.999**c)) + 1e-8)
                bias -= 0.01 * at / lr * float(np.sign(r.mean()))  # small steps: it starts at the click rate
    return w, bias


def ladder_rows(name: str, lad: Ladder, lrs: tuple[float, ...] = LRS) -> list[dict]:
    every, kept = np.concatenate(lad.days), np.concatenate(lad.kept)
    plans = [  # (matrices, segments, shuffle) of each step
        (lad.one_vocab, [every], True),
        (lad.one_vocab, [every], False),
        (lad.one_vocab, [kept], False),
        (lad.one_vocab, lad.kept, False),
        (lad.per_day, lad.kept, False),
        (lad.per_day, lad.carried, False),
    ]
    rows = []
    for step, ((x, x_later), segments, shuffle) in zip(STEPS, plans, strict=True):
        row = {"dataset": name, "setting": step}
        for lr in lrs:
            w, b = train_lr(x, lad.labels, segments, lr=lr, shuffle=shuffle)
            row[f"lr {lr:g}"] = auc(lad.later_labels, 1 / (1 + np.exp(-(x_later @ w + b))))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quality_ladder", description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="*", default=["criteo", "avazu"])
    p.add_argument("--lrs", nargs="*", type=float, default=list(LRS), help="sparse learning rates of each step")
    p.add_argument("--out", default="quality-ladder")
    from bench._common import add_smoke, apply_smoke, print_table, write_json

    add_smoke(p)  # Criteo at one learning rate
    args = apply_smoke(p.parse_args(argv), {"datasets": ["criteo"], "lrs": [LRS[1]]})

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ladder-") as tmp:
        for name in args.datasets:
            rows += ladder_rows(name, build(name, Path(tmp) / name), tuple(args.lrs))
    print_table([{k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows])
    print("later-day AUC of a per-key-Adam LR (NumPy) at each sparse lr; each setting adds one thing the product does")
    print(f"results: {write_json(args.out, {'rows': rows, 'params': vars(args)})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
