"""The companion: a Poly2 LR fit beside the network on every row so far, its logit averaged into every score.

`model.companion`: `auto` (the default) on a small day with own keys (`why_none`), `poly2` on every day.  After a
day's training rank 0 fits it (`fit_for_spec`) on the newest `model.companion_rows` rows of, oldest first: the
rows the parent's companion was fit on, the parent's eval rows, and the day's train rows.  The day's eval rows
never: the gate scores the model on them; so no source of the day's date or later but its train rows (a
rerun's parent is the same date's model).  The row sources follow the model's lineage (model.json
`companion.sources`), so the fit depends on the run's inputs (`TrainSpec.identity`: the features, the model
started from, the model config) and on which of those rows are still on disk (a source deleted since is skipped
and named: `read_rows`).  Its C is chosen by cross-validation of the rows (`fit_cv`), and kept by the days after
(`kept_c`) until their rows double or a week of fits has used it: a kept C is one fit, where the choice makes
six or more before that one (three folds, two Cs at the fewest).

Why a second learner: on small days the mean of the network's logit and a converged, strongly regularised
Poly2 fit of every row so far gains over the network alone on both real samples, where no change inside the
network did (issue 31, docs/benchmarks.md).  Its inputs are the values' own keys, admitted or not (`r_<j>`,
written with `encode.raw_keys`; a bag field's first value): a value too rare for a row of the network's still
gets a weight, and its pairs theirs, as a hashed LR's do; the log1p dense columns, bucketed
(`trainer.models.poly2`); and each key's count class in the fit rows (`trainer.models.key_counts`), so a value
too rare for a weight of its own still says how rare it is.

Stored as `companion.safetensors` (the weights, and the fit rows' key counts a scorer counts against) in the
model directory and the serving bundle (`save`, `load`); every scorer blends through
`trainer.scoring.score_arrays`.  A model with a companion is written as model.json version 4, which releases
that cannot blend it with its counts refuse (`trainer.model_dir.MODEL`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from storage.features_manifest import (
    FeaturesManifest,
    raw_columns,
    read_features_manifest,
)
from storage.io import fsio
from trainer.data import FeatureSchema, list_parts
from trainer.models.key_counts import KeyCounts
from trainer.models.poly2 import (
    Poly2,
    Poly2Config,
    bucket_tokens,
    fit,
    fit_cv,
    pair_ids,
    single_ids,
)
from trainer.plan.recipe import CROSS_MIN_ROWS

log = logging.getLogger(__name__)

FILE = "companion.safetensors"
KIND = "poly2"
INPUTS = "pairs+counts"
"""model.json `companion.inputs`: the tokens and their pairs, and each key's count class (`KeyCounts`).  A record
without it is a companion of the pairs alone (before the counts), which scores so and whose C is not kept."""
CONFIG = Poly2Config()
"""The fit's settings: 2^22 buckets, C from 0.001..0.1 by 3-fold cross-validation of the rows (what the benchmarks
measured)."""
C_SEARCH_GROWTH = 2
"""A day's fit keeps its parent's C until its rows are this many times those the C was chosen on (`kept_c`)."""
C_SEARCH_FITS = 7
"""... or until this many fits have used it: a lineage at `model.companion_rows` chooses again weekly."""


@dataclass(frozen=True)
class Companion:
    """A fit companion as a scorer uses it: logits of feature rows."""

    poly2: Poly2
    bits: int
    counts: KeyCounts | None
    """The fit rows' key counts; None for a companion of the pairs alone (a file written before them)."""

    def logits(self, keys: np.ndarray, dense: np.ndarray | None) -> np.ndarray:
        """(N,) float64 logits of rows given as key columns (N, F) int64 and log1p dense columns (N, n) or None."""
        ids, log_dense = inputs(keys, dense, self.bits, self.counts)
        return self.poly2.logits(ids, log_dense)


def inputs(
    keys: np.ndarray, dense: np.ndarray | None, bits: int, counts: KeyCounts | None, *, fit_rows: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """The Poly2's inputs of feature rows: the pair ids of each row's keys and dense buckets (the buckets take
    the field numbers after the keys'), then with `counts` each key's count token alone (`KeyCounts.tokens`;
    `fit_rows`: the rows `counts` were counted on, each left out of its own count); and the log1p dense values
    as float64."""
    keys = np.asarray(keys, dtype=np.int64)
    d = np.zeros((len(keys), 0)) if dense is None else np.asarray(dense, dtype=np.float64)
    ids = pair_ids(np.concatenate([keys, bucket_tokens(d, keys.shape[1])], axis=1), bits)
    if counts is not None:
        ids = np.concatenate([ids, single_ids(counts.tokens(keys, leave_one_out=fit_rows), bits)], axis=1)
    return ids, d


def blend(network_logits: np.ndarray, companion_logits: np.ndarray) -> np.ndarray:
    """The score's logit: the mean of the network's and the companion's (the weight the benchmarks chose)."""
    return (network_logits + companion_logits) / 2


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


def why_none(mode: str, features: FeaturesManifest) -> str | None:
    """Why the day's model gets no companion (`model.companion`), or None when it gets one.

    `auto` gives one to a day of fewer than `CROSS_MIN_ROWS` train rows encoded with the values' own keys: the
    days too small for the network's cross term, where the companion gained on both real samples; on synthetic
    days of 36,000 rows it cost 0.0013 (not decided) and 7x the train stage's time (docs/benchmarks.md).  `poly2`
    gives one to every day (its rows' keys are checked when they are read).
    """
    if mode == "off":
        return "model.companion is off"
    if mode == "poly2":
        return None
    if features.rows_train >= CROSS_MIN_ROWS:
        return (
            f"the day's {features.rows_train:,} train rows are not fewer than {CROSS_MIN_ROWS:,}: a day that "
            "large trains the network's cross term, and the companion stays out (model.companion=poly2 to fit one)"
        )
    if not features.raw_keys:
        return (
            "the day's features carry no own keys r_<j> (a day of more rows than encode.raw_keys_up_to, or "
            "encoded before them)"
        )
    return None


def read_rows(
    candidates: list[tuple[str, str, int | None]],
    schema: FeatureSchema,
    max_rows: int,
    storage_options: dict | None = None,
    *,
    without_keys: str = "raise",
    day: str | None = None,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, list[RowSource], list[str]]:
    """The newest `max_rows` rows of the candidates (newest source first, each its newest rows), in time order:
    the values' own keys (`r_<j>`, `encode.raw_keys`), the dense columns and the labels.

    A source whose rows are gone (features deleted by hand) is skipped and named: the companion is fit on the
    rows still there rather than failing an unattended day.  So is, with `without_keys="skip"`
    (`model.companion: auto`), a source encoded without the own keys (a large day of the lineage).  With `day`
    (the date of the last candidate, the day's train rows), so is every other source not of an earlier date: a
    rerun of a day, or a backfill of an older one, must not fit the day's eval rows (the gate's) or its train
    rows twice.

    Returns:
        (own keys (N, F) int64, dense (N, n) float32 or None, labels (N,) float64, the sources as read, oldest
        first, and the skipped ones as `url (split)`).

    Raises:
        FileNotFoundError: no source has rows.
        ValueError: a source's rows lack the own keys (encoded without `encode.raw_keys`), with
            `without_keys="raise"` (`model.companion: poly2`).
    """
    raw = list(raw_columns(schema.key_columns))
    cols = ["label", *schema.dense_columns, *raw]
    parts: list[tuple[Any, RowSource]] = []
    skipped: list[str] = []
    left = max_rows
    for i, (url, split, most) in enumerate(reversed(candidates)):
        if left <= 0:
            break
        if i and day is not None and (when := _date_of(url, storage_options)) is not None and when >= day:
            log.warning(
                "companion: the rows of %s (%s) are of %s, not before the day's %s; fitting without them",
                url,
                split,
                when,
                day,
            )
            skipped.append(f"{url} ({split}): not before {day}")
            continue
        try:
            files = list_parts(fsio.join(fsio.data_url(url, storage_options), split), storage_options)
        except FileNotFoundError:
            log.warning("companion: the rows of %s (%s) are gone; fitting without them", url, split)
            skipped.append(f"{url} ({split})")
            continue
        fs, _ = fsio.get_fs(url, storage_options)
        want = left if most is None else min(left, most)
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
            skipped.append(f"{url} ({split}): no own keys")
            continue
        frame = pd.concat(tables, ignore_index=True)
        take = min(len(frame), want)
        frame = frame.iloc[len(frame) - take :]
        parts.append((frame, RowSource(features_url=url, split=split, rows=take)))
        left -= take
    if not parts:
        raise FileNotFoundError(f"the companion has no rows to fit: every source was skipped ({'; '.join(skipped)})")
    parts.reverse()
    rows = pd.concat([p for p, _ in parts], ignore_index=True)
    keys = rows[raw].to_numpy(np.int64)
    dense = rows[list(schema.dense_columns)].to_numpy(np.float32) if schema.dense_columns else None
    return keys, dense, rows["label"].to_numpy(np.float64), [s for _, s in parts], skipped


def _date_of(url: str, storage_options: dict | None) -> str | None:
    """The date of the committed features directory `url` (its manifest's), or None when it has none."""
    fs, path = fsio.get_fs(url, storage_options)
    try:
        manifest = read_features_manifest(fs, path)
    except FileNotFoundError:
        return None
    return manifest.date if manifest is not None else None


def fit_rows(
    keys: np.ndarray,
    dense: np.ndarray | None,
    labels: np.ndarray,
    *,
    config: Poly2Config = CONFIG,
    chosen: dict[str, Any] | None = None,
) -> tuple[Companion, dict[str, Any]]:
    """The companion of rows in time order, and its record for model.json.

    Its C is cross-validation's (`fit_cv`), or, with `chosen` (the parent's C, `kept_c`), that C refit on these
    rows: the refit alone, where the choice makes three fits per C tried (three or four Cs on the real samples)
    before it.
    """
    t0 = time.perf_counter()
    counts = KeyCounts.of(keys)
    ids, log_dense = inputs(keys, dense, config.bits, counts, fit_rows=True)
    if chosen is None:
        poly2, losses = fit_cv(ids, log_dense, labels, config=config)
        chosen = {"rows": int(len(labels)), "fits_ago": 0}
    else:
        poly2, losses = fit(ids, log_dense, labels, float(chosen["C"]), config=config), {}
        chosen = {"rows": int(chosen["rows"]), "fits_ago": int(chosen["fits_ago"]) + 1}
    # the scorer uses the weights as saved (float32): the record's numbers are the saved model's
    saved = _rounded(poly2)
    record = {
        "kind": KIND,
        "bits": config.bits,
        "inputs": INPUTS,
        "C": saved.C,
        "C_chosen": chosen,
        "rows": int(len(labels)),
        "buckets": int(saved.buckets.size),
        "holdout_logloss": {str(c): v for c, v in losses.items()},
        "fit_s": round(time.perf_counter() - t0, 3),
    }
    return Companion(saved, config.bits, counts), record


def kept_c(parent: dict[str, Any] | None, rows: int, config: Poly2Config = CONFIG) -> dict[str, Any] | None:
    """The parent companion's C and when it was chosen (`{"C", "rows", "fits_ago"}`), when the day's fit keeps
    it; None when cross-validation chooses again.

    It chooses again once the rows are `C_SEARCH_GROWTH` times those it chose on, after `C_SEARCH_FITS`
    fits, or when the parent chose its C otherwise (a record before `C_chosen`, other buckets or inputs, a C off
    the grid).
    On both real samples' lineages the time split that chose before chose one C from day 2 to day 4 (Criteo
    0.003, Avazu 0.01), so a kept C changed no AUC there (docs/benchmarks.md, "The companion's fit, cheaper").
    """
    if not parent or (parent.get("kind"), parent.get("bits"), parent.get("inputs")) != (KIND, config.bits, INPUTS):
        return None
    chosen = parent.get("C_chosen")
    if not isinstance(chosen, dict) or parent.get("C") not in config.cs:
        return None
    if rows >= C_SEARCH_GROWTH * int(chosen["rows"]) or int(chosen["fits_ago"]) + 1 >= C_SEARCH_FITS:
        return None
    return {"C": float(parent["C"]), "rows": int(chosen["rows"]), "fits_ago": int(chosen["fits_ago"])}


def fit_for_spec(
    features_url: str,
    schema: FeatureSchema,
    max_rows: int,
    *,
    parent: dict[str, Any] | None,
    parent_features_url: str | None,
    storage_options: dict | None = None,
    config: Poly2Config = CONFIG,
    auto: bool = False,
) -> tuple[Companion, dict[str, Any]] | None:
    """The day's companion: fit on the newest `max_rows` rows of its lineage (`candidate_sources`).

    Args:
        features_url: the day's committed features (their train rows).
        parent: the start model's companion record (model.json `companion`), or None.
        parent_features_url: the start model's features (their eval rows), or None without a start model.
        auto: `model.companion: auto`: a source without the own keys is skipped, and rows of one label give
            no companion (None), where `poly2` raises.

    Raises:
        ValueError: with `auto` false, a source without the own keys, or rows of one label.
    """
    candidates = candidate_sources(parent, parent_features_url, features_url)
    keys, dense, labels, sources, skipped = read_rows(
        candidates,
        schema,
        max_rows,
        storage_options,
        without_keys="skip" if auto else "raise",
        day=_date_of(features_url, storage_options),
    )
    if labels.min() == labels.max():
        if auto:
            log.info("companion: none for this model: its %d rows are all of one label", len(labels))
            return None
        raise ValueError(
            f"the companion's {len(labels)} rows are all of one label: nothing to fit; "
            "set model.companion=auto (no companion on such a day)"
        )
    companion, record = fit_rows(keys, dense, labels, config=config, chosen=kept_c(parent, len(labels), config))
    record["sources"] = [s.to_dict() for s in sources]
    if skipped:
        record["skipped_sources"] = skipped
    how = (
        "by cross-validation"
        if not record["C_chosen"]["fits_ago"]
        else f"kept from the choice on {record['C_chosen']['rows']:,} rows"
    )
    log.info(
        "companion: poly2 fit on %d rows of %d sources, C %s (%s), %.1f s",
        len(labels),
        len(sources),
        record["C"],
        how,
        record["fit_s"],
    )
    return companion, record


def _rounded(p: Poly2) -> Poly2:
    return Poly2(
        buckets=p.buckets,
        weights=p.weights.astype(np.float32).astype(np.float64),
        dense_weights=p.dense_weights.astype(np.float32).astype(np.float64),
        bias=float(np.float32(p.bias)),
        C=p.C,
    )


def to_bytes(companion: Companion) -> bytes:
    """The companion as a safetensors file (no pickles)."""
    p = companion.poly2
    return st_save(
        {
            "buckets": np.ascontiguousarray(p.buckets, dtype=np.int64),
            "weights": p.weights.astype(np.float32),
            "dense_weights": p.dense_weights.astype(np.float32),
            "bias": np.array([p.bias], dtype=np.float32),
            "C": np.array([p.C], dtype=np.float64),
            "bits": np.array([companion.bits], dtype=np.int64),
            **(
                {}
                if companion.counts is None
                else {"count_keys": companion.counts.keys, "count_values": companion.counts.counts.astype(np.int32)}
            ),
        }
    )


def from_bytes(data: bytes | bytearray, where: str) -> Companion:
    """A companion from `to_bytes`'s file.

    Raises:
        ValueError: the file is not a companion (the message names `where`).
    """
    try:
        t = st_load(bytes(data))
        poly2 = Poly2(
            buckets=t["buckets"].astype(np.int64),
            weights=t["weights"].astype(np.float64),
            dense_weights=t["dense_weights"].astype(np.float64),
            bias=float(t["bias"][0]),
            C=float(t["C"][0]),
        )
        bits = int(t["bits"][0])
        counts = (
            KeyCounts(t["count_keys"].astype(np.int64), t["count_values"].astype(np.int64))
            if "count_keys" in t
            else None
        )
    except Exception as exc:  # safetensors raises its own types on a bad file
        raise ValueError(f"{where} is not a companion file ({type(exc).__name__}: {exc}); retrain the model") from None
    if poly2.buckets.shape != poly2.weights.shape:
        raise ValueError(f"{where}: {poly2.buckets.size} buckets but {poly2.weights.size} weights; retrain the model")
    return Companion(poly2, bits, counts)


def save(url: str, companion: Companion, storage_options: dict | None = None) -> None:
    fs, path = fsio.get_fs(url, storage_options)
    with fs.open(path, "wb") as f:
        f.write(to_bytes(companion))


def load(url: str, storage_options: dict | None = None) -> Companion:
    """The companion file at `url`.

    Raises:
        FileNotFoundError: no file there (a model.json that names a companion needs it).
    """
    fs, path = fsio.get_fs(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(f"{url} is missing: the model's model.json names a companion; retrain the model")
    with fs.open(path, "rb") as f:
        return from_bytes(f.read(), url)
