"""The datasets of `bench.quality` as a user has them: day files, and a later day file to score on.

- criteo: the shared Criteo head (row order is time order): rows 1-4,000 and 4,001-8,000 are two
  training days, rows 8,001-10,000 the later day;
- avazu: the shared Avazu hour, split the same way; each file's `hour` is moved to its own date
  (the rows of one day file must carry that day's date) and is not a feature;
- synthetic-N: `pipeline.generate` days with `interactions` planted pairs: two training days of 0.4 N
  rows and a later day of 0.2 N rows, whose true click probabilities give the ceiling.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.generate import generate_days
from pipeline.ingest.parse import read_log_file

DATA = Path(os.environ.get("CTR_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
REAL = {"criteo": ("criteo/train_head_10k.tsv", "criteo"), "avazu": ("avazu/avazu_14102100.csv", "avazu")}
REAL_DAYS = (4_000, 4_000, 2_000)
"""Rows of the two training days and of the later day (at most: the Avazu sample has 9,999), in file order."""
REAL_START = {"criteo": "2026-01-01", "avazu": "2014-10-21"}
SYNTHETIC_START = "2026-01-01"


@dataclass(frozen=True)
class DayFiles:
    """One dataset written as day files."""

    name: str
    fmt: str
    url: str
    """`input.url` of the days (a `{date}` placeholder)."""
    train_dates: tuple[str, ...]
    later_date: str
    truth: np.ndarray | None = None
    """True click probabilities of the later day's rows (synthetic data only)."""
    seed: int | None = None
    """The generator's seed (synthetic data only): with the planted pairs' count it names the click model."""

    def path(self, date: str) -> str:
        return self.url.replace("{date}", date)

    @property
    def later(self) -> str:
        return self.path(self.later_date)

    def train_events(self) -> pd.DataFrame:
        """The rows of every training day file, as the product parses them."""
        return pd.concat([read_log_file(self.path(d), self.fmt)[0] for d in self.train_dates], ignore_index=True)

    def later_events(self) -> pd.DataFrame:
        return read_log_file(self.later, self.fmt)[0]

    def train_split_events(self, eval_fraction: float) -> pd.DataFrame:
        """The rows the published model has trained on: every training day's rows but the last day's last
        `eval_fraction`.  Each day holds its last tenth out for its publish gate (`pipeline.encode.split`'s
        time-order split), and the next day trains it (`trainer.plan.parent_eval`); the last day's stays out."""
        from pipeline.encode.split import eval_size

        days = [read_log_file(self.path(d), self.fmt)[0] for d in self.train_dates]
        last = days[-1]
        return pd.concat([*days[:-1], last.iloc[: len(last) - eval_size(len(last), eval_fraction)]], ignore_index=True)


def real_rows(name: str, *, data: Path = DATA) -> int:
    """Rows of the shared sample `name` (its header not counted)."""
    rel, fmt = REAL[name]
    with open(data / rel) as f:
        return sum(1 for _ in f) - (fmt == "avazu")


def _dates(start: str, n: int) -> list[str]:
    return [str(np.datetime64(start) + np.timedelta64(i, "D")) for i in range(n)]


def real_days(name: str, out: Path, *, data: Path = DATA, counts: tuple[int, ...] = REAL_DAYS) -> DayFiles:
    """Write the shared sample `name` (criteo or avazu) under `data` as day files under `out`, in file order:
    `counts` rows each (default: two training days and a later day), the last day the later one.

    Raises:
        FileNotFoundError: the shared sample is not there (set CTR_SHARED_DATA to the shared data folder).
    """
    rel, fmt = REAL[name]
    source = data / rel
    if not source.exists():
        raise FileNotFoundError(f"{source}: the shared {name} sample is missing (set CTR_SHARED_DATA to its folder)")
    lines = source.read_text().splitlines(keepends=True)
    header, body = (lines[0], lines[1:]) if fmt == "avazu" else ("", lines)
    out.mkdir(parents=True, exist_ok=True)
    dates = _dates(REAL_START[name], len(counts))
    suffix = ".csv" if fmt == "avazu" else ".tsv"
    start = 0
    for date, n in zip(dates, counts, strict=True):
        rows = body[start : start + n]
        start += n
        if fmt == "avazu":  # hour YYMMDDHH: keep the hour, take the file's date
            yymmdd = date[2:4] + date[5:7] + date[8:10]
            rows = [",".join([*(f := line.split(","))[:2], yymmdd + f[2][6:], *f[3:]]) for line in rows]
        (out / f"day_{date}{suffix}").write_text(header + "".join(rows))
    return DayFiles(name, fmt, str(out / f"day_{{date}}{suffix}"), tuple(dates[:-1]), dates[-1])


def synthetic_days(rows: int, out: Path, *, interactions: int, seed: int = 0) -> DayFiles:
    """Write `rows` synthetic rows as two training days (0.4 each) and a later day (0.2), with its truth."""
    counts = (round(rows * 0.4), round(rows * 0.4), rows - 2 * round(rows * 0.4))
    days = generate_days(
        str(out), 3, counts, seed=seed, start_date=SYNTHETIC_START, with_truth=True, interactions=interactions
    )
    truth = np.load(out / f"day_{days[-1].date}.truth.npy").astype(np.float64)
    return DayFiles(
        f"synthetic-{rows // 1000}k",
        "criteo",
        str(out / "day_{date}.tsv.gz"),
        tuple(d.date for d in days[:-1]),
        days[-1].date,
        truth,
        seed,
    )


def dataset_days(name: str, out: Path, *, interactions: int) -> DayFiles:
    """`criteo`, `avazu` or `synthetic-<N>k` written under `out`.

    Raises:
        ValueError: an unknown name.
    """
    if name in REAL:
        return real_days(name, out)
    if name.startswith("synthetic-") and name.endswith("k") and name[10:-1].isdigit():
        return synthetic_days(int(name[10:-1]) * 1000, out, interactions=interactions)
    raise ValueError(f"unknown dataset {name!r}: criteo, avazu or synthetic-<N>k (e.g. synthetic-100k)")
