"""The companion as a scorer uses it: its inputs of feature rows, its logits, and the blend with the network's.

What the fit (`trainer.companion.fit`) produces, the file holds (`trainer.companion.file`) and every scorer
blends (`trainer.eval.scoring.score_arrays`, `flows.serving.model`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainer.companion.key_counts import KeyCounts
from trainer.companion.poly2 import Poly2, bucket_tokens, pair_ids, single_ids

KIND = "poly2"
"""model.json `companion.kind`: the learner."""
INPUTS = "pairs+counts"
"""model.json `companion.inputs`: the tokens and their pairs, and each key's count class (`KeyCounts`).  A record
without it is a companion of the pairs alone (before the counts), which scores so and whose C is not kept."""


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
