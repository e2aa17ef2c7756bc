"""Days the publish gate decides, built by hand in a root: hand-made models (tests/helpers/model_dirs.py) whose
scores set the labels a test needs, the days' feature rows, earlier days' records, and the day's state after
training, so that the real evaluate and publish stages run in a second, without Dask or torchrun.

The model reads `d_0`, `k_0`, `k_1` (fields a and b); a day's rows may carry the own keys `r_0`, `r_1` (what a
companion reads, `encode.raw_keys`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
from fsspec.implementations.local import LocalFileSystem

from flows.config import RunConfig
from flows.day.record import DayRecord, Status, write_record
from flows.day.state import DayState
from storage.io.layout import Layout
from tests.helpers.model_dirs import KEYS, make_model_dir
from trainer import model_dir
from trainer.companion import file as companion_file
from trainer.companion.fit import fit_rows
from trainer.companion.poly2 import Poly2Config
from trainer.eval.scoring import load_model, score
from trainer.model_dir import read_meta, write_meta
from trainer.plan.published import Published

OUTPUT_BIAS = "over.mlp.3.bias"
"""The network's last bias: adding b to it adds b to every logit."""


def rows(n: int, seed: int, *, own_keys: bool = False) -> pd.DataFrame:
    """`n` feature rows without labels: `d_0` uniform, `k_0` of 10..13 and the unknown 99, `k_1` of 10..13, and with
    `own_keys` the values' own keys `r_0`, `r_1` (0..9)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {"d_0": rng.random(n).astype(np.float32), "k_0": rng.choice([*KEYS, 99], n), "k_1": rng.choice(KEYS, n)}
    )
    if own_keys:
        frame["r_0"], frame["r_1"] = rng.integers(0, 10, n), rng.integers(0, 10, n)
    return frame


def model(root: Path, name: str, seed: int) -> str:
    """A committed model directory (the same `seed`: the same network)."""
    return str(make_model_dir(root, name, seed=seed)[0])


def probabilities(url: str, frame: pd.DataFrame) -> np.ndarray:
    """The model's scores of `frame`, as served (its companion blended in when it has one)."""
    return score(load_model(url), frame)


def calibrate(url: str, frame: pd.DataFrame, rate: float) -> None:
    """Shift the network's logits so that its mean score on `frame` is `rate`."""
    p = probabilities(url, frame)
    z = np.log(p / (1 - p))
    lo, hi = -30.0, 30.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (1 / (1 + np.exp(-(z + mid)))).mean() < rate else (lo, mid)
    tensors = model_dir.read_tensors(f"{url}/{model_dir.DENSE}")
    model_dir.write_tensors(f"{url}/{model_dir.DENSE}", {**tensors, OUTPUT_BIAS: tensors[OUTPUT_BIAS] + lo})


def add_companion(url: str, frame: pd.DataFrame) -> None:
    """Fit a companion on `frame` (`r_0`, `r_1`, `d_0`, `label`) and add it to the model directory."""
    fitted, record = fit_rows(
        frame[["r_0", "r_1"]].to_numpy(np.int64),
        frame[["d_0"]].to_numpy(np.float64),
        frame["label"].to_numpy(np.float64),
        config=Poly2Config(bits=12, cs=(1.0,)),
    )
    companion_file.save(f"{url}/{companion_file.FILE}", fitted)
    write_meta(LocalFileSystem(), url, _with_companion(read_meta(url), record))


def _with_companion(meta, record):
    from dataclasses import replace

    return replace(meta, companion={**record, "sources": []})


def write_day(layout: Layout, date: str, eval_rows: pd.DataFrame) -> str:
    """The day's features: `eval_rows` (with `label`) as its eval split, and its train split (the same rows: the
    gate never reads them, the next-day sample does); returns the features url."""
    url = layout.features(date)
    for split in ("train", "eval"):
        Path(url, split).mkdir(parents=True, exist_ok=True)
        eval_rows.to_parquet(Path(url, split, "part-00000.parquet"), index=False)
    return url


def past_day(layout: Layout, date: str, status: Status, *, carried: str | None = None) -> None:
    """An earlier day's record: completed with `status`, its run having trained on `carried`'s eval rows first."""
    train = {"parent_eval": {"date": carried, "rows": 0, "reason": ""}}
    write_record(layout, DayRecord(date=date, completed=True, status=status, reason="", train=train))


def trained_day(
    cfg: RunConfig, date: str, *, candidate: str, published: Published | None, carried: str | None = None
) -> DayState:
    """The day's state after its train stage: the day's features, the candidate, the model it started from, and
    the date whose eval rows it trained on first (`carried`)."""
    layout = cfg.layout()
    parent = published.version if published else None
    train = SimpleNamespace(
        result=SimpleNamespace(model_url=candidate),
        parent_eval=SimpleNamespace(carried=SimpleNamespace(date=carried) if carried else None),
        parent_version=parent,
        run_tag=f"{date}:{parent}:test",
        record=lambda: {"parent_eval": {"date": carried}},
    )
    ingest = SimpleNamespace(inputs=[], rows_read=0, rows_written=0, rows_quarantined=0, rows_other_dates=0)
    checks = SimpleNamespace(report=SimpleNamespace(results=[], note="", window=()), stats={})
    eval_rows = len(pd.read_parquet(Path(layout.features(date), "eval")))
    encode = SimpleNamespace(url=layout.features(date), rows_train=eval_rows, rows_eval=eval_rows)
    state = DayState(date=date, layout=layout, published=published)
    for name, result in (
        ("ingest", ingest),
        ("vocab", SimpleNamespace(admitted=0)),
        ("encode", encode),
        ("checks", checks),
        ("warm", SimpleNamespace(record=dict)),
        ("train", train),
    ):
        state = state.with_result(name, result)
    return state


def published(url: str, version: str = "v00001") -> Published:
    return Published(version, url, read_meta(url))
