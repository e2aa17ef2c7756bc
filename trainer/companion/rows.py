"""The rows a companion is fit on: the newest rows of its lineage's sources, read as the fit takes them.

The sources are, oldest first, the rows the parent's companion was fit on, the parent's eval rows and the day's
train rows (`candidate_sources`); `read_rows` takes the newest `model.companion_rows` of them, skipping (and
naming) a source that is gone, lacks the values' own keys, or is not of a date before the day's.  A source whose
manifest states no date is refused (`date_of`): the guard that keeps the gate's eval rows out of the fit reads the
dates, and a guard that turned itself off would fit them unseen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from storage.features_manifest import raw_columns, read_features_manifest
from storage.io import fsio
from storage.io.fsio import SUCCESS
from trainer.data import FeatureSchema, list_parts

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RowSource:
    """Rows a companion was fit on: the newest `rows` of a features directory's split."""

    features_url: str
    split: str
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {"features_url": self.features_url, "split": self.split, "rows": self.rows}


def candidate_sources(
    parent: dict[str, Any] | None, parent_features_url: str | None, features_url: str
) -> list[tuple[str, str, int | None]]:
    """(features_url, split, most rows or None for all), oldest first: the parent companion's sources, the
    parent's eval rows, the day's train rows."""
    out: list[tuple[str, str, int | None]] = []
    if parent:
        out += [(s["features_url"], s["split"], int(s["rows"])) for s in parent.get("sources", [])]
    if parent_features_url:
        out.append((parent_features_url, "eval", None))
    out.append((features_url, "train", None))
    return out


def read_rows(
    candidates: list[tuple[str, str, int | None]],
    schema: FeatureSchema,
    max_rows: int,
    storage_options: dict | None = None,
    *,
    without_keys: str = "raise",
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, list[RowSource], list[str]]:
    """The newest `max_rows` rows of the candidates (newest source first, each its newest rows), in time order:
    the values' own keys (`r_<j>`, `encode.raw_keys`), the dense columns and the labels.

    A source whose rows are gone (features deleted by hand) is skipped and named: the companion is fit on the
    rows still there rather than failing an unattended day.  So is, with `without_keys="skip"`
    (`model.companion: auto`), a source encoded without the own keys (a large day of the lineage).  So is every
    source not of a date before the last candidate's (the day's train rows): a rerun of a day, or a backfill of
    an older one, must not fit the day's eval rows (the gate's) or its train rows twice.

    Returns:
        (own keys (N, F) int64, dense (N, n) float32 or None, labels (N,) float64, the sources as read, oldest
        first, and the skipped ones as `url (split)`).

    Raises:
        FileNotFoundError: no source has rows, or the day's own features are gone.
        ValueError: a source's manifest states no date (`date_of`), or its rows lack the own keys (encoded
            without `encode.raw_keys`), with `without_keys="raise"` (`model.companion: poly2`).
    """
    day = date_of(candidates[-1][0], storage_options)
    if day is None:
        raise FileNotFoundError(f"the day's features {candidates[-1][0]} are gone: run the encode stage again")
    raw = list(raw_columns(schema.key_columns))
    cols = ["label", *schema.dense_columns, *raw]
    parts: list[tuple[pd.DataFrame, RowSource]] = []
    skipped: list[str] = []
    left = max_rows
    for i, (url, split, most) in enumerate(reversed(candidates)):
        if left <= 0:
            break
        if i and (when := date_of(url, storage_options)) is not None and when >= day:
            log.warning(
                "companion: the rows of %s (%s) are of %s, not before the day's %s; fitting without them",
                url,
                split,
                when,
                day,
            )
            skipped.append(f"{url} ({split}): not before {day}")
            continue
        want = left if most is None else min(left, most)
        frame, why = _newest_rows(url, split, storage_options, cols=cols, raw=raw, want=want, without_keys=without_keys)
        if frame is None:
            skipped.append(why)
            continue
        parts.append((frame, RowSource(features_url=url, split=split, rows=len(frame))))
        left -= len(frame)
    if not parts:
        raise FileNotFoundError(f"the companion has no rows to fit: every source was skipped ({'; '.join(skipped)})")
    parts.reverse()
    rows = pd.concat([p for p, _ in parts], ignore_index=True)
    keys = rows[raw].to_numpy(np.int64)
    dense = rows[list(schema.dense_columns)].to_numpy(np.float32) if schema.dense_columns else None
    return keys, dense, rows["label"].to_numpy(np.float64), [s for _, s in parts], skipped


def _newest_rows(
    url: str,
    split: str,
    storage_options: dict | None,
    *,
    cols: list[str],
    raw: list[str],
    want: int,
    without_keys: str,
) -> tuple[pd.DataFrame | None, str]:
    """The newest `want` rows (at most) of one source's split, or (None, why it is skipped), logged.

    Raises:
        ValueError: its rows lack the own keys `raw`, with `without_keys="raise"`.
    """
    try:
        files = list_parts(fsio.join(fsio.data_url(url, storage_options), split), storage_options)
    except FileNotFoundError:
        log.warning("companion: the rows of %s (%s) are gone; fitting without them", url, split)
        return None, f"{url} ({split})"
    fs, _ = fsio.get_fs(url, storage_options)
    tables: list[pd.DataFrame] = []
    for f in reversed(files):  # the newest part first: a large source is read only as far as its rows are taken
        with fs.open(f, "rb") as fh:
            names = pq.ParquetFile(fh).schema_arrow.names
            if not set(raw) <= set(names):
                if without_keys == "skip":
                    break
                raise ValueError(
                    f"the companion's rows {f} lack the values' own keys (r_<j>): they were encoded "
                    "without encode.raw_keys; encode that date again with encode.raw_keys=true "
                    "(`--force`), or set model.companion=auto"
                )
            tables.insert(0, pq.read_table(fh, columns=cols).to_pandas())
        if sum(len(t) for t in tables) >= want:
            break
    if not tables:
        log.warning("companion: the rows of %s (%s) carry no own keys r_<j>; fitting without them", url, split)
        return None, f"{url} ({split}): no own keys"
    frame = pd.concat(tables, ignore_index=True)
    take = min(len(frame), want)
    return frame.iloc[len(frame) - take :], ""


def date_of(url: str, storage_options: dict | None) -> str | None:
    """The date of the committed features directory `url` (its manifest's), or None when the directory is gone
    (`read_rows` skips it and names it).

    Raises:
        ValueError: `url` is there but its manifest (`_SUCCESS.json`) is missing or states no date: whether its
            rows are before the day's cannot be told, and fitting them could fit the gate's eval rows.
    """
    fs, path = fsio.get_fs(url, storage_options)
    manifest = read_features_manifest(fs, path)
    if manifest is not None and manifest.date is not None:
        return manifest.date
    if manifest is None and not fs.exists(path):
        return None
    success = fsio.join(url, SUCCESS)
    what = f"are not committed ({success} is missing)" if manifest is None else f"have no date ({success} states none)"
    raise ValueError(
        f"the companion's rows {url} {what}: a companion is fit only on rows of dates "
        "before the day's, so that the gate's eval rows stay out of it; encode that date again "
        "(`ctrpipe run --date <its date> --force`: the manifest it writes states the date), or set "
        "model.companion=off"
    )
