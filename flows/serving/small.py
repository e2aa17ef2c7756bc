"""The features of a few plain lines without the Arrow and pandas machinery: a request of one line in ~0.1 ms.

`FeatureSpec.parse_lines` (ingest's parser, then the encode stage) costs about 10 ms of CPU
whatever the number of lines: Arrow's CSV reader, pandas frames, a factorize per field.  At
batch 1 that fixed cost is nearly all of a request.  `small_features` computes the same features for
a batch of at most `SMALL_BATCH` lines when every line is plainly valid (a known label, every
field present, integers written plainly, no bags or timestamps), with the same functions for keys
and the same dense transform, and returns None for anything else, so the caller takes the
feature path: every refusal reason, quirk and format still comes from the one implementation.
tests/flows/serving/test_small.py checks that both give identical frames on the real Criteo samples.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from pipeline.encode.feature_spec import FeatureSpec, Parsed
from pipeline.encode.keys import FIELD_SHIFT, hash_value, missing_key, oov_key
from pipeline.encode.stage import dense_columns, features_schema, key_columns

SMALL_BATCH = 32
"""Most lines a batch may have for this path; above it the vectorised feature path is the faster."""
_PLAIN_INT = re.compile(r"-?(?:0|[1-9][0-9]{0,14})")
"""Integers both parsers read identically (no sign +, no leading zeros, exact in float64)."""


def small_features(lines: Sequence[str], spec: FeatureSpec) -> Parsed | None:
    """`spec.parse_lines(lines)` when every line is plain (see the module docstring), else None."""
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
    cols: dict[str, np.ndarray] = {"label": np.asarray(labels, np.float32)}
    x = np.asarray(dense, np.float64).reshape(n, len(dense_at)).astype(np.float32)
    d = np.log1p(np.maximum(np.nan_to_num(x, nan=0.0), 0.0)).astype(np.float32)  # as the encode stage
    for i, name in enumerate(dense_columns(s)):
        cols[name] = np.ascontiguousarray(d[:, i])
    h = np.asarray(hashes, np.int64).reshape(n, len(cat_at))
    admitted = spec.admitted
    for j, name in enumerate(key_columns(s)):
        present = h[:, j] >= 0
        keys = np.where(present, h[:, j] | (j << FIELD_SHIFT), 0)
        if len(admitted):
            pos = np.minimum(np.searchsorted(admitted, keys), len(admitted) - 1)
            known = admitted[pos] == keys
        else:
            known = np.zeros(n, bool)
        cols[name] = np.where(present, np.where(known, keys, oov_key(j)), missing_key(j)).astype(np.int64)
    frame = pd.DataFrame({name: cols[name] for name in features_schema(s).names})
    return Parsed(features=frame, index=np.arange(n, dtype=np.int64), errors=[])
