"""The features of a few plain lines without the Arrow and pandas machinery.

`FeatureSpec.parse_lines` (ingest's parser, then the encode stage) has a fixed CPU cost of milliseconds
whatever the number of lines: Arrow's CSV reader, pandas frames, a factorize per field
(`docs/reports/2026-12-02-serve-small-batches.md`).  At
batch 1 that fixed cost is nearly all of a request.  `small_batch` computes the same features for
a batch of at most `SMALL_BATCH` lines when every line is plainly valid (a known label, every
field present, integers written plainly, no bags or timestamps), with the same functions for keys
and the same dense transform, and returns None for anything else, so the caller takes the
feature path: every refusal reason, quirk and format still comes from the one implementation.
The arrays go to `trainer.eval.scoring.score_arrays` (the core of `score_features`), with no frame in between;
tests/flows/serving/test_small.py checks that both paths give identical frames on the real Criteo samples.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.encode.feature_spec import FeatureSpec, Parsed
from pipeline.encode.frame import dense_columns, features_schema, key_columns
from pipeline.encode.keys import FIELD_SHIFT, hash_value, missing_key, oov_key
from storage.features_manifest import raw_column

SMALL_BATCH = 32
"""Most lines a batch may have for this path; above it the vectorised feature path is the faster."""
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,14})")
"""Integers both parsers read identically (no sign +, no leading zeros, exact in float64)."""


@dataclass(frozen=True)
class SmallBatch:
    """The features of plain lines as the network's arrays."""

    label: np.ndarray
    """(B,) float32."""
    dense: np.ndarray
    """(B, n) float32, C order: log1p(max(x, 0)), missing -> 0."""
    keys: np.ndarray
    """(B, F) int64: admitted, OOV or missing keys."""
    own: np.ndarray
    """(B, F) int64: each value's own key, admitted or not, or the missing key (`r_<j>`, a companion's input)."""

    def frame(self, spec: FeatureSpec) -> pd.DataFrame:
        """The frame `FeatureSpec.parse_lines` gives for the same lines."""
        s = spec.schema
        cols = {
            "label": self.label,
            **{c: self.dense[:, i] for i, c in enumerate(dense_columns(s))},
            **{c: self.keys[:, j] for j, c in enumerate(key_columns(s))},
            **{raw_column(j): self.own[:, j] for j in range(self.own.shape[1])},
        }
        return pd.DataFrame({name: cols[name] for name in features_schema(s, raw_keys=spec.raw_keys).names})


def small_features(lines: Sequence[str], spec: FeatureSpec) -> Parsed | None:
    """`spec.parse_lines(lines)` when every line is plain (see the module docstring), else None."""
    batch = small_batch(lines, spec)
    if batch is None:
        return None
    return Parsed(features=batch.frame(spec), index=np.arange(len(lines), dtype=np.int64), errors=[])


def fits(spec: FeatureSpec, dense: Sequence[str], keys: Sequence[str], bags: Sequence[str]) -> bool:
    """Whether a model of these input columns takes a `SmallBatch` as it is (columns in the feature path's order)."""
    s = spec.schema
    return (
        not bags
        and list(dense) == dense_columns(s)
        and list(keys) == key_columns(s)
        and s.timestamp is None
        and not s.multi_valued
        and not s.floats
    )


def small_batch(lines: Sequence[str], spec: FeatureSpec) -> SmallBatch | None:
    """The features of `lines` when every one is plain (see the module docstring), else None."""
    s = spec.schema
    if not 0 < len(lines) <= SMALL_BATCH or s.timestamp is not None or s.multi_valued or s.floats:
        return None
    ncols, sep = len(s.columns), s.separator
    label_at = s.columns.index(s.label)
    dense_at = [s.columns.index(c) for c in s.dense]
    cat_at = [s.columns.index(c) for c in s.categorical]
    positive, negative = set(s.label_positive), set(s.label_negative)
    labels, dense, hashes = [], [], []
    for line in lines:
        fields = line.split(sep)
        if len(fields) != ncols or "\n" in line or "\r" in line:
            return None
        label = fields[label_at]
        if label in positive:
            labels.append(1.0)
        elif label in negative:
            labels.append(0.0)
        else:
            return None
        row = []
        for c in dense_at:
            text = fields[c]
            if text == "":
                row.append(np.nan)
            elif _PLAIN_INT.fullmatch(text):
                row.append(float(text))
            else:
                return None
        dense.append(row)
        try:
            hashes.append([hash_value(fields[c]) if fields[c] else -1 for c in cat_at])
        except UnicodeEncodeError:  # a lone surrogate: the feature path says what is wrong with it
            return None
    n = len(lines)
    x = np.asarray(dense, np.float64).reshape(n, len(dense_at)).astype(np.float32)
    d = np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)).astype(np.float32)  # as the encode stage
    h = np.asarray(hashes, np.int64).reshape(n, len(cat_at))
    present = h >= 0
    keys = np.where(present, h | (np.arange(len(cat_at), dtype=np.int64) << FIELD_SHIFT), 0)
    admitted = spec.admitted
    if len(admitted):
        pos = np.minimum(np.searchsorted(admitted, keys), len(admitted) - 1)
        known = admitted[pos] == keys
    else:
        known = np.zeros(keys.shape, bool)
    oov = np.array([oov_key(j) for j in range(len(cat_at))], np.int64)
    missing = np.array([missing_key(j) for j in range(len(cat_at))], np.int64)
    out = np.where(present, np.where(known, keys, oov), missing).astype(np.int64)
    own = np.where(present, keys, missing).astype(np.int64)
    return SmallBatch(label=np.asarray(labels, np.float32), dense=np.ascontiguousarray(d), keys=out, own=own)
