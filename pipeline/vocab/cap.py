"""The per-field cap across buckets: keep each field's `max_keys_per_field` highest scores.

The cap is the one step of the merge that is not per key.  It needs each
capped field's cut: the score s* of its cap-th key and how many keys scoring
exactly s* each bucket keeps (smaller keys first; within a field bucket order is
key order).  `CapSearch` finds it on the driver with a radix search over the
score's bits: each round every bucket task returns a histogram of its admitted
scores inside the current boundary bin (at most 2**13 bins per field) and the
driver narrows the bin, until one bin holds one score value.  No key travels to
the driver; integer counts need at most two rounds, any float at most five.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

RADIX_SHIFTS = (52, 39, 26, 13, 0)
"""Score bits are examined sign+exponent first, then 13 mantissa bits per round."""


def score_bits(score: np.ndarray) -> np.ndarray:
    """int64 whose order is the order of the (non-negative) scores: the float64 bit pattern.

    Raises:
        ValueError: a score is negative (counts and decay weights never are).
    """
    score = np.asarray(score, dtype=np.float64)
    if (score < 0).any():
        raise ValueError("vocabulary scores must be >= 0")
    return (score + 0.0).view(np.int64)  # + 0.0 turns -0.0 into 0.0


Query = Mapping[int, tuple[int, int]]
"""field -> (prefix, prefix_shift): the keys whose score bits >> prefix_shift == prefix (shift 64: all)."""


@dataclass(frozen=True, slots=True)
class Histogram:
    """Admitted keys of one field in one bucket, by score bin (bins = score bits >> shift, ascending)."""

    bins: np.ndarray
    counts: np.ndarray
    lowest: np.ndarray
    """Smallest score bits in each bin."""
    highest: np.ndarray


def cap_histograms(
    *, field: np.ndarray, bits: np.ndarray, admitted: np.ndarray, query: Query, shift: int
) -> dict[int, Histogram]:
    """One bucket's answer to a `CapSearch` round: a histogram per queried field.

    Args:
        field, bits, admitted: per key of the bucket (bits = `score_bits` of the score).
        query: `CapSearch.query()`.
        shift: `CapSearch.shift`.
    """
    out = {}
    for f, (prefix, prefix_shift) in query.items():
        mask = admitted & (field == f)
        if prefix_shift < 64:
            mask &= (bits >> prefix_shift) == prefix
        b = np.sort(bits[mask])
        if not len(b):
            out[f] = Histogram(*(np.empty(0, np.int64) for _ in range(4)))
            continue
        bins = b >> shift
        starts = np.flatnonzero(np.r_[True, bins[1:] != bins[:-1]])
        ends = np.r_[starts[1:], len(b)].astype(np.int64)
        out[f] = Histogram(bins=bins[starts], counts=ends - starts, lowest=b[starts], highest=b[ends - 1])
    return out


@dataclass(frozen=True, slots=True)
class FieldCut:
    """Where the cap cuts one field: keep scores above `bits`, and at `bits` the first `take[b]` keys of bucket b."""

    bits: int
    take: tuple[int, ...]


@dataclass
class CapSearch:
    """Driver side of the cap: finds each over-full field's `FieldCut` from per-bucket histograms.

    Usage::

        search = CapSearch(cap=cap, admitted=per_field_admitted_counts, buckets=B)
        while not search.done:
            search.absorb([bucket_task(b, search.query(), search.shift) for b in range(B)])
        search.cuts  # {field: FieldCut}
    """

    cap: int
    admitted: np.ndarray
    """Admitted keys per field before the cap, all buckets."""
    buckets: int
    cuts: dict[int, FieldCut] = field(default_factory=dict)
    _state: dict[int, list[int]] = field(default_factory=dict)  # field -> [prefix, prefix_shift, keys still needed]
    _round: int = 0

    def __post_init__(self) -> None:
        for f in np.flatnonzero(np.asarray(self.admitted) > self.cap):
            self._state[int(f)] = [0, 64, self.cap]

    @property
    def done(self) -> bool:
        """Whether every over-full field's cut is found (`cuts` is complete)."""
        return not self._state

    @property
    def shift(self) -> int:
        """This round's bin width: histogram bins are score bits >> shift."""
        return RADIX_SHIFTS[self._round]

    def query(self) -> dict[int, tuple[int, int]]:
        """This round's question to every bucket: the boundary bin of each pending field."""
        return {f: (s[0], s[1]) for f, s in self._state.items()}

    def absorb(self, answers: Sequence[Mapping[int, Histogram]]) -> None:
        """Narrow every pending field with one histogram per bucket (in bucket order)."""
        if len(answers) != self.buckets:
            raise ValueError(f"expected {self.buckets} bucket answers, got {len(answers)}")
        shift = self.shift
        for f, state in list(self._state.items()):
            hists = [a[f] for a in answers]
            bins = np.concatenate([h.bins for h in hists])
            uniq, inverse = np.unique(bins, return_inverse=True)
            total = np.bincount(inverse, weights=np.concatenate([h.counts for h in hists]), minlength=len(uniq))
            lowest = np.full(len(uniq), np.iinfo(np.int64).max)
            np.minimum.at(lowest, inverse, np.concatenate([h.lowest for h in hists]))
            highest = np.full(len(uniq), np.iinfo(np.int64).min)
            np.maximum.at(highest, inverse, np.concatenate([h.highest for h in hists]))
            need = state[2]
            above = np.cumsum(total[::-1])  # keys in this bin or higher, bins from the top
            top = int(np.searchsorted(above, need))  # first bin (from the top) reaching `need`
            if top >= len(uniq):
                raise ValueError(f"field {f}: the buckets report fewer admitted keys than the first pass counted")
            i = len(uniq) - 1 - top
            need -= int(above[top] - total[i])
            if lowest[i] == highest[i] or shift == 0:
                take, left = [], need
                for h in hists:  # bucket order is key order within a field: smaller keys first
                    at = np.searchsorted(h.bins, uniq[i])
                    n = int(h.counts[at]) if at < len(h.bins) and h.bins[at] == uniq[i] else 0
                    take.append(min(n, left))
                    left -= take[-1]
                self.cuts[f] = FieldCut(bits=int(lowest[i]), take=tuple(take))
                del self._state[f]
            else:
                self._state[f] = [int(uniq[i]), shift, need]
        self._round += 1


def cap_mask(
    *, field: np.ndarray, bits: np.ndarray, admitted: np.ndarray, cuts: Mapping[int, tuple[int, int]]
) -> np.ndarray:
    """`admitted` after the cap, for one bucket whose keys are sorted.

    Args:
        cuts: field -> (score bits of the cut, how many keys scoring exactly that this bucket keeps).
    """
    keep = admitted.copy()
    for f, (cut, take) in cuts.items():
        in_field = admitted & (field == f)
        ties = np.flatnonzero(in_field & (bits == cut))
        keep[in_field & (bits < cut)] = False
        keep[ties[take:]] = False
    return keep
