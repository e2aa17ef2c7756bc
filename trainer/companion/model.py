"""The companion as a scorer uses it: its inputs of feature rows, its logits, and the blend with the network's.

What the fit (`trainer.companion.fit`) produces, the file holds (`trainer.companion.file`) and every scorer
blends (`trainer.eval.scoring.score_arrays`, `flows.serving.model`) with the weight its model.json record states
(`blend_weight_of`): a weight is a choice of the model's config (`model.companion_blend_weight`), never one a
scorer makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.companion.key_counts import KeyCounts
from trainer.companion.poly2 import Poly2, bucket_tokens, pair_ids, single_ids

KIND = "poly2"
"""model.json `companion.kind`: the learner."""
INPUTS = "pairs+counts"
"""model.json `companion.inputs`: the tokens and their pairs, and each key's count class (`KeyCounts`).  A record
without it is a companion of the pairs alone (before the counts), which scores so and whose C is not kept."""


UNRECORDED_BLEND_WEIGHT = 0.5
"""The network's weight in the blend of a record without `blend_weight`: every scorer took the mean before the
weight was recorded."""


@dataclass(frozen=True)
class Companion:
    """A fit companion as a scorer uses it: logits of feature rows, and its weight in the blend."""

    poly2: Poly2
    bits: int
    counts: KeyCounts | None
    """The fit rows' key counts; None for a companion of the pairs alone (a file written before them)."""
    blend_weight: float
    """The network's logit weight w in a score's logit (`blend`); model.json `companion.blend_weight`."""

    def blend(self, network_logits: np.ndarray, companion_logits: np.ndarray) -> np.ndarray:
        """The score's logit of the network's and this companion's (`blend` at `blend_weight`)."""
        return blend(network_logits, companion_logits, self.blend_weight)

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


def blend(
    network_logits: np.ndarray, companion_logits: np.ndarray, weight: float = UNRECORDED_BLEND_WEIGHT
) -> np.ndarray:
    """The score's logit: weight * the network's + (1 - weight) * the companion's (the mean by default, the
    `bench.quality_rolling` probe's blend; a scorer passes its model's recorded weight, `Companion.blend`)."""
    return weight * network_logits + (1.0 - weight) * companion_logits


def blend_weight_of(record: dict[str, Any], where: str) -> float:
    """The network's blend weight a companion record (model.json `companion`) states: its `blend_weight`, or
    `UNRECORDED_BLEND_WEIGHT` for a record written before the weight was.

    Raises:
        ValueError: a `blend_weight` that is not a number in [0, 1] (the message names `where`).
    """
    weight = record.get("blend_weight", UNRECORDED_BLEND_WEIGHT)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0.0 <= weight <= 1.0:
        raise ValueError(
            f"{where}: companion.blend_weight must be a number in [0, 1], got {weight!r}; retrain the model"
        )
    return float(weight)
