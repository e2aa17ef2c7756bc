"""Generated raw Criteo days for the data-stage tests, and readers of what ingest committed."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

DAYS = ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04")
ROWS_PER_DAY = 4000


@dataclass(frozen=True)
class RawDays:
    """Where `generate_days` wrote DAYS of ROWS_PER_DAY rows each (`raw/day_D.tsv.gz` names)."""

    path: Path
    dates: tuple[str, ...] = DAYS
    rows: int = ROWS_PER_DAY


def events_of(root: Path, date: str) -> pd.DataFrame:
    """The committed events of `date` under a local root, parts in name (time) order."""
    parts = sorted((root / "events" / f"date={date}").glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def siblings(root: Path, stage: str) -> list[str]:
    """The entries of `<root>/<stage>/`: committed dates, and any staging or old copies left behind."""
    return sorted(p.name for p in (root / stage).iterdir()) if (root / stage).exists() else []


def criteo_text(raw_days: RawDays, n: int, date: str = DAYS[0]) -> bytes:
    """The first `n` lines of the generated raw day `date`, uncompressed."""
    return b"".join(gzip.decompress((raw_days.path / f"day_{date}.tsv.gz").read_bytes()).splitlines(True)[:n])
