"""The features of a few plain lines without the Arrow and pandas machinery, for every schema.

`FeatureSpec.parse_lines` (ingest's parser, then the encode stage) has a fixed CPU cost of milliseconds
whatever the number of lines: Arrow's CSV reader, pandas frames, a factorize per field
(`docs/reports/2026-12-02-serve-small-batches.md`).  At
batch 1 that fixed cost is nearly all of a request.  `small_batch` computes the same features for
a batch of at most `SMALL_BATCH` whole lines (`flows.serving.lines` writes every request entry as one) when
every line is plainly valid (a known label, every field present, numbers written plainly, the timestamp the
placeholder `flows.serving.lines` writes), with the encode stage's own rules (`pipeline.encode.frame`:
`dense_transform`, `admit`; the keys of `pipeline.encode.keys`), bags of multi-valued fields included, and
returns None for anything else, so the caller takes the feature path: every refusal reason, quirk and format
still comes from the one implementation.  A schema whose features read the timestamp (derived time features)
always takes the feature path.
The arrays go to `trainer.eval.scoring.score_arrays` (the core of `score_features`), with no frame in between;
tests/flows/serving/test_small.py (Criteo) and test_request_columns.py (Avazu, floats and bags) check that both
paths give identical frames.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from flows.serving.lines import placeholder_timestamp
from pipeline.encode.feature_spec import FeatureSpec, Parsed
from pipeline.encode.frame import admit, bag_columns, dense_columns, dense_transform, features_schema, key_columns
from pipeline.encode.keys import FIELD_SHIFT, hash_value, missing_key, oov_key
from pipeline.schema import LogSchema
from storage.features_manifest import raw_column
from trainer.bags import Jagged

SMALL_BATCH = 32
"""Most lines a batch may have for this path; above it the vectorised feature path is the faster."""
_PLAIN_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]{0,39})(?:\.[0-9]{1,40})?(?:[eE][+-]?[0-9]{1,3})?")
"""Decimals both parsers read identically (correctly rounded to float64; no sign +, no leading zeros or spaces)."""


@dataclass(frozen=True)
class SmallBatch:
    """The features of plain lines as the network's arrays."""

    label: np.ndarray
    """(B,) float32."""
    dense: np.ndarray
    """(B, n) float32, C order: log1p(max(x, 0)), missing -> 0."""
    keys: np.ndarray
    """(B, F) int64: admitted, OOV or missing keys (a multi-valued field: its first value's)."""
    own: np.ndarray
    """(B, F) int64: each value's own key, admitted or not, or the missing key (`r_<j>`, a companion's input)."""
    bags: list[Jagged]
    """Every value's key (admitted, else OOV) of each multi-valued field, in `bag_columns` order."""

    def frame(self, spec: FeatureSpec) -> pd.DataFrame:
        """The frame `FeatureSpec.parse_lines` gives for the same lines."""
        s = spec.schema
        cols = {
            "label": self.label,
            **{c: self.dense[:, i] for i, c in enumerate(dense_columns(s))},
            **{c: self.keys[:, j] for j, c in enumerate(key_columns(s))},
            **{raw_column(j): self.own[:, j] for j in range(self.own.shape[1])},
            **{
                c: [b.values[b.offsets[i] : b.offsets[i + 1]] for i in range(len(b))]
                for c, b in zip(bag_columns(s), self.bags, strict=True)
            },
        }
        return pd.DataFrame({name: cols[name] for name in features_schema(s, raw_keys=spec.raw_keys).names})


def small_features(lines: Sequence[str], spec: FeatureSpec) -> Parsed | None:
    """`spec.parse_lines(lines)` when every line is plain (see the module docstring), else None."""
    batch = small_batch(lines, spec)
    if batch is None:
        return None
    return Parsed(features=batch.frame(spec), index=np.arange(len(lines), dtype=np.int64), errors=[])


def fits(spec: FeatureSpec, dense: Sequence[str], keys: Sequence[str], bags: Sequence[str]) -> bool:
    """Whether a model of these input columns takes a `SmallBatch` as it is (columns in the feature path's order;
    no bag columns: a model pooling bags `none`)."""
    s = spec.schema
    return (
        list(dense) == dense_columns(s)
        and list(keys) == key_columns(s)
        and list(bags) in ([], bag_columns(s))
        and not s.reads_timestamp
    )


@dataclass(frozen=True)
class _Plan:
    """Where a schema's values are in a line, and what a plain one holds."""

    ncols: int
    label_at: int
    ts_at: int | None
    placeholder: str
    dense_at: tuple[int, ...]
    cat_at: tuple[int, ...]
    multi: tuple[tuple[int, int, str], ...]
    """(field index, column index, inner separator) of each multi-valued field."""
    positive: frozenset[str]
    negative: frozenset[str]
    field: np.ndarray
    """(F,) int64: each field's index in the keys' top bits."""
    oov: np.ndarray
    missing: np.ndarray


@functools.lru_cache(maxsize=64)
def _plan(s: LogSchema) -> _Plan:
    multi = s.multi_separator
    nf = len(s.categorical)
    return _Plan(
        ncols=len(s.columns),
        label_at=s.columns.index(s.label),
        ts_at=s.columns.index(s.timestamp) if s.timestamp is not None else None,
        placeholder=placeholder_timestamp(s),
        dense_at=tuple(s.columns.index(c) for c in s.dense),
        cat_at=tuple(s.columns.index(c) for c in s.categorical),
        multi=tuple((j, s.columns.index(c), multi[c]) for j, c in enumerate(s.categorical) if c in multi),
        positive=frozenset(s.label_positive),
        negative=frozenset(s.label_negative),
        field=np.arange(nf, dtype=np.int64) << FIELD_SHIFT,
        oov=np.array([oov_key(j) for j in range(nf)], np.int64),
        missing=np.array([missing_key(j) for j in range(nf)], np.int64),
    )


def small_batch(lines: Sequence[str], spec: FeatureSpec) -> SmallBatch | None:
    """The features of `lines` when every one is plain (see the module docstring), else None."""
    s = spec.schema
    if not 0 < len(lines) <= SMALL_BATCH or s.reads_timestamp:
        return None
    p, plain = _plan(s), _PLAIN_NUMBER.fullmatch
    labels, dense, hashes = [], [], []
    bag_values: list[list[list[int]]] = [[] for _ in p.multi]  # per multi-valued field, per line: its values' hashes
    for line in lines:
        fields = line.split(s.separator)
        if len(fields) != p.ncols or "\n" in line or "\r" in line:
            return None
        if p.ts_at is not None and fields[p.ts_at] != p.placeholder:
            return None
        label = fields[p.label_at]
        if label in p.positive:
            labels.append(1.0)
        elif label in p.negative:
            labels.append(0.0)
        else:
            return None
        row = []
        for c in p.dense_at:
            text = fields[c]
            if text == "":
                row.append(math.nan)
            elif plain(text):
                row.append(float(text))
            else:
                return None
        dense.append(row)
        try:
            h = [hash_value(t) if (t := fields[c]) else -1 for c in p.cat_at]
            for k, (j, c, inner) in enumerate(p.multi):
                values = [hash_value(v) for v in fields[c].split(inner) if v]  # "" inside a list is not a value
                h[j] = values[0] if values else -1
                bag_values[k].append(values)
        except UnicodeEncodeError:  # a lone surrogate: the feature path says what is wrong with it
            return None
        hashes.append(h)
    n = len(lines)
    x = np.asarray(dense, np.float64).reshape(n, len(p.dense_at))
    if np.isinf(x).any():  # "1e999": not a finite number, the feature path says so
        return None
    first = np.asarray(hashes, np.int64).reshape(n, len(p.cat_at))
    present = first >= 0
    own = np.where(present, first | p.field, p.missing)
    return SmallBatch(
        label=np.asarray(labels, np.float32),
        dense=np.ascontiguousarray(dense_transform(x.astype(np.float32))),
        keys=np.where(present, admit(own, spec.admitted, p.oov), p.missing),
        own=own,
        bags=[
            _bag(values, int(p.field[j]), int(p.oov[j]), spec.admitted)
            for (j, _, _), values in zip(p.multi, bag_values, strict=True)
        ],
    )


def _bag(values: list[list[int]], field: int, oov: int, admitted: np.ndarray) -> Jagged:
    """The keys (admitted, else `oov`) of each line's values of one multi-valued field, from their hashes."""
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    flat = np.array([h for v in values for h in v], np.int64) | field
    return Jagged(values=admit(flat, admitted, oov), offsets=offsets)
