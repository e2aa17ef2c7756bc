"""The companion's fit: whether a day gets one, its C (chosen by cross-validation or kept), the fit and its record.

Rank 0 calls `fit_for_spec` after training, before the commit (`trainer.commit`), on the rows `trainer.companion.rows`
reads; the record it returns is model.json `companion`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from storage.features_manifest import FeaturesManifest
from trainer.companion.key_counts import KeyCounts
from trainer.companion.model import INPUTS, KIND, Companion, inputs
from trainer.companion.poly2 import Poly2, Poly2Config, fit, fit_cv
from trainer.companion.rows import candidate_sources, read_rows
from trainer.data import FeatureSchema
from trainer.models.config import COMPANION_BLEND_WEIGHT
from trainer.plan.recipe import CROSS_MIN_ROWS

log = logging.getLogger(__name__)

CONFIG = Poly2Config()
"""The fit's settings: 2^22 buckets, C from 0.001..0.1 by 3-fold forward-chaining cross-validation of the rows (what
the benchmarks measured: `trainer.companion.poly2.fit_cv`)."""
C_SEARCH_GROWTH = 2
"""A day's fit keeps its parent's C until its rows are this many times those the C was chosen on (`kept_c`)."""
C_SEARCH_FITS = 7
"""... or until this many fits have used it: a lineage at `model.companion_rows` chooses again weekly."""


def why_none(mode: str, features: FeaturesManifest) -> str | None:
    """Why the day's model gets no companion (`model.companion`), or None when it gets one.

    `auto` gives one to a day of fewer than `CROSS_MIN_ROWS` train rows encoded with the values' own keys: the
    days too small for the network's cross term, where the companion gained on both real samples; on larger
    synthetic days it gained nothing and multiplied the train stage's time
    (`docs/reports/2026-12-05-companion.md`).  `poly2` gives one to every day (its rows' keys are checked when
    they are read).
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


def fit_rows(
    keys: np.ndarray,
    dense: np.ndarray | None,
    labels: np.ndarray,
    *,
    config: Poly2Config = CONFIG,
    chosen: dict[str, Any] | None = None,
    blend_weight: float = COMPANION_BLEND_WEIGHT,
) -> tuple[Companion, dict[str, Any]]:
    """The companion of rows in time order, and its record for model.json.

    Its C is cross-validation's (`fit_cv`), or, with `chosen` (the parent's C, `kept_c`), that C refit on these
    rows: the refit alone, where the choice makes three fits per C tried (three or four Cs on the real samples)
    before it.  The record says how the fit stopped (`convergence`: converged or not, the Newton steps, the final
    gradient norm) and the network's `blend_weight` (`model.companion_blend_weight`; `ModelMeta.of` writes the
    config's).
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
        "convergence": poly2.convergence.to_dict() if poly2.convergence is not None else None,
        "blend_weight": blend_weight,
        "fit_s": round(time.perf_counter() - t0, 3),
    }
    return Companion(saved, config.bits, counts, blend_weight), record


def kept_c(parent: dict[str, Any] | None, rows: int, config: Poly2Config = CONFIG) -> dict[str, Any] | None:
    """The parent companion's C and when it was chosen (`{"C", "rows", "fits_ago"}`), when the day's fit keeps
    it; None when cross-validation chooses again.

    It chooses again once the rows are `C_SEARCH_GROWTH` times those it chose on, after `C_SEARCH_FITS`
    fits, or when the parent chose its C otherwise (a record before `C_chosen`, other buckets or inputs, a C off
    the grid).
    On both real samples' lineages the choice was one C from day 2 to day 4, so a kept C changed no AUC there.
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
    blend_weight: float = COMPANION_BLEND_WEIGHT,
) -> tuple[Companion, dict[str, Any]] | None:
    """The day's companion: fit on the newest `max_rows` rows of its lineage (`candidate_sources`).

    Args:
        features_url: the day's committed features (their train rows).
        parent: the start model's companion record (model.json `companion`), or None.
        parent_features_url: the start model's features (their eval rows), or None without a start model.
        auto: `model.companion: auto`: a source without the own keys is skipped, and rows of one label give
            no companion (None), where `poly2` raises.
        blend_weight: `model.companion_blend_weight`, the network's weight in every score (`fit_rows`).

    Raises:
        ValueError: a source whose manifest states no date (`trainer.companion.rows.date_of`); with `auto` false,
            a source without the own keys, or rows of one label.
    """
    candidates = candidate_sources(parent, parent_features_url, features_url)
    keys, dense, labels, sources, skipped = read_rows(
        candidates,
        schema,
        max_rows,
        storage_options,
        without_keys="skip" if auto else "raise",
    )
    if labels.min() == labels.max():
        if auto:
            log.info("companion: none for this model: its %d rows are all of one label", len(labels))
            return None
        raise ValueError(
            f"the companion's {len(labels)} rows are all of one label: nothing to fit; "
            "set model.companion=auto (no companion on such a day)"
        )
    companion, record = fit_rows(
        keys, dense, labels, config=config, chosen=kept_c(parent, len(labels), config), blend_weight=blend_weight
    )
    record["sources"] = [s.to_dict() for s in sources]
    if skipped:
        record["skipped_sources"] = skipped
    how = (
        "by cross-validation"
        if not record["C_chosen"]["fits_ago"]
        else f"kept from the choice on {record['C_chosen']['rows']:,} rows"
    )
    done = record["convergence"]
    log.info(
        "companion: poly2 fit on %d rows of %d sources, C %s (%s), %s after %d Newton steps, %.1f s",
        len(labels),
        len(sources),
        record["C"],
        how,
        "converged" if done["converged"] else f"unconverged ({done['stop']})",
        done["newton_steps"],
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
        convergence=p.convergence,
    )
