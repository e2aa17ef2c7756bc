"""The feature spec: what turns a raw log line, or a row of named fields, into exactly the training inputs.

A serving bundle freezes it (`to_dict` as `feature_spec.json`, the admitted keys beside it), so a
server needs neither the root's `vocab/` nor this repository's configuration:

    format / schema     the log's columns in file order, separator, label values, timestamp, multi-valued fields
    key hashing         key = field_index << 56 | xxhash64(utf-8 value) & (2^56 - 1)   (`pipeline.encode.keys`)
    OOV rule            a value whose key is not among the admitted keys -> the field's OOV key;
                        missing or empty -> the field's missing key
    dense transform     d = log1p(max(x, 0)), missing -> 0; then (inside the network) `dense_buckets`
                        buckets up to `dense_bucket_max`
    bags                a multi-valued field's keys, pooled with `bag_pooling`

There is one implementation of the feature path: lines are parsed by the ingest parser
(`pipeline.ingest.parse.parse_chunk`: the same rules, the same quarantine reasons) and encoded by the encode
stage's `encode_frame`; a row of named fields is first written back as a line of the format, so it
takes the same path.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pipeline.encode.frame import bag_columns, encode_frame
from pipeline.encode.keys import FIELD_SHIFT, MISSING_HASH, OOV_HASH
from pipeline.ingest.parse import ORDER_FILE_SHIFT, parse_chunk
from pipeline.schema import LogSchema

SPEC_FORMAT = "ctr-pipeline-feature-spec/1"
_FIRST_LINE = 2
"""Request lines are parsed as if they followed line 1: no header or byte-order mark is looked for."""


@dataclass(frozen=True)
class Parsed:
    """Lines parsed for scoring: the valid rows' features and, for the others, why they were refused."""

    features: pd.DataFrame
    """Training inputs (`label`, `d_*`, `k_*`, `bag_*`) of the valid lines, in input order."""
    index: np.ndarray
    """int64: the input position of each row of `features`."""
    errors: list[tuple[int, str]]
    """(input position, reason) of every refused line, ascending; reasons as in ingest's quarantine."""


@dataclass(frozen=True)
class FeatureSpec:
    """Everything between a raw log line and the model's inputs (see the module docstring).

    Args:
        schema: the log format the model was trained on.
        admitted: sorted int64 keys of the model's vocabulary (every other value is OOV).
        bag_pooling: `model.bag_pooling` of the model (how bags become one row per field).
        dense_buckets: `model.dense_buckets` (applied inside the exported network; recorded here).
        dense_bucket_max: `model.dense_bucket_max`.
        raw_keys: also give every value's own key (`r_<j>`): a model with a companion reads them.
    """

    schema: LogSchema
    admitted: np.ndarray
    bag_pooling: str = "mean"
    dense_buckets: int = 0
    dense_bucket_max: float = 0.0
    raw_keys: bool = False

    def __post_init__(self) -> None:
        keys = np.ascontiguousarray(self.admitted, dtype=np.int64)
        if keys.size > 1 and not (keys[1:] > keys[:-1]).all():
            raise ValueError("the admitted keys of a feature spec must be sorted and distinct")
        object.__setattr__(self, "admitted", keys)

    # ---- the feature path ------------------------------------------------------------------------
    def parse_lines(self, lines: Sequence[str]) -> Parsed:
        """Parse and encode raw log lines (one event each, in the model's input format, label included).

        A line holding a line break is refused ("line break in line"); every other line is parsed
        as ingest parses a file, so a malformed one gets ingest's quarantine reason.
        """
        errors: list[tuple[int, str]] = []
        kept: list[int] = []
        for i, line in enumerate(lines):
            if "\n" in line or "\r" in line:
                errors.append((i, "line break in line: send one log line per entry"))
            else:
                kept.append(i)
        if not kept:
            return Parsed(
                features=encode_frame(_no_events(self.schema), self.schema, self.admitted, raw_keys=self.raw_keys),
                index=np.zeros(0, np.int64),
                errors=errors,
            )
        data = ("\n".join(lines[i] for i in kept) + "\n").encode("utf-8", "surrogatepass")
        chunk = parse_chunk(data, schema=self.schema, file="request", first_line=_FIRST_LINE)
        at = np.asarray(kept, dtype=np.int64)
        errors += [
            (int(at[line - _FIRST_LINE]), reason)
            for line, reason in zip(chunk.quarantine["line"], chunk.quarantine["reason"], strict=True)
        ]
        lines_of = (chunk.events["order"].to_numpy(np.int64) & ((1 << ORDER_FILE_SHIFT) - 1)) - _FIRST_LINE
        return Parsed(
            features=encode_frame(chunk.events, self.schema, self.admitted, raw_keys=self.raw_keys),
            index=at[lines_of],
            errors=sorted(errors),
        )

    def rows_to_lines(self, rows: Sequence[Any]) -> tuple[list[str | None], list[tuple[int, str]]]:
        """Write rows of named fields (`{"C1": "68fd1e64", "I1": 5, ...}`) as lines of the format.

        A field left out is missing; the label may be left out (it is not scored).  A row that is not
        an object, names a field the format lacks, or holds a value that cannot be written in one field
        gets None and a reason.
        """
        s = self.schema
        known = set(s.columns)
        multi = s.multi_separator
        lines: list[str | None] = []
        errors: list[tuple[int, str]] = []
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                lines.append(None)
                errors.append((i, f"row is not an object of fields, got {type(row).__name__}"))
                continue
            unknown = sorted(str(k) for k in row if k not in known)
            if unknown:
                lines.append(None)
                errors.append((i, f"unknown fields {unknown}; the format {s.name} has {list(s.columns)}"))
                continue
            try:
                values = [_field_text(c, row.get(c), s.separator, multi.get(c)) for c in s.columns]
            except ValueError as exc:
                lines.append(None)
                errors.append((i, str(exc)))
                continue
            if row.get(s.label) is None:
                values[s.columns.index(s.label)] = s.label_negative[0]
            lines.append(s.separator.join(values))
        return lines, errors

    def parse_rows(self, rows: Sequence[Any]) -> Parsed:
        """`rows_to_lines`, then `parse_lines` on the rows that could be written."""
        lines, errors = self.rows_to_lines(rows)
        good = [i for i, line in enumerate(lines) if line is not None]
        parsed = self.parse_lines([lines[i] for i in good])  # type: ignore[misc]
        at = np.asarray(good, dtype=np.int64)
        return Parsed(
            features=parsed.features,
            index=at[parsed.index] if len(good) else parsed.index,
            errors=sorted(errors + [(int(at[i]), r) for i, r in parsed.errors]),
        )

    # ---- the file ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """`feature_spec.json` (the admitted keys are stored beside it; their count is recorded here)."""
        s = self.schema
        return {
            "format": SPEC_FORMAT,
            "schema": _schema_dict(s),
            "field_order": list(s.categorical),
            "dense_order": list(s.dense),
            "key_hashing": {
                "hash": "xxhash64 of the value's UTF-8 text, masked to 56 bits (0 -> 2, 1 -> 3)",
                "key": f"field_index << {FIELD_SHIFT} | hash",
                "oov_hash": OOV_HASH,
                "missing_hash": MISSING_HASH,
            },
            "oov_rule": "a key not among the admitted keys becomes its field's OOV key; missing or empty values "
            "the field's missing key",
            "admitted_keys": int(self.admitted.size),
            "dense_transform": "log1p(max(x, 0)), missing -> 0",
            "dense_buckets": self.dense_buckets,
            "dense_bucket_max": self.dense_bucket_max,
            "bag_columns": bag_columns(s),
            "bag_pooling": self.bag_pooling,
            **({"raw_keys": True} if self.raw_keys else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], admitted: np.ndarray) -> FeatureSpec:
        """The spec of a `feature_spec.json` and its admitted keys.

        Raises:
            ValueError: another format, or an admitted-key count that does not match the file's.
        """
        if data.get("format") != SPEC_FORMAT:
            raise ValueError(f"feature spec has format {data.get('format')!r}, this code reads {SPEC_FORMAT!r}")
        if int(data["admitted_keys"]) != len(admitted):
            raise ValueError(f"feature spec names {data['admitted_keys']} admitted keys, {len(admitted)} were given")
        raw = dict(data["schema"])
        fields = {f.name: f for f in dataclasses.fields(LogSchema)}
        schema = LogSchema(
            **{  # type: ignore[arg-type]  # JSON values: LogSchema checks them
                k: (tuple(tuple(p) for p in v) if k == "multi_valued" else tuple(v) if isinstance(v, list) else v)
                for k, v in raw.items()
                if k in fields
            }
        )
        return cls(
            schema=schema,
            admitted=admitted,
            bag_pooling=data["bag_pooling"],
            dense_buckets=int(data["dense_buckets"]),
            dense_bucket_max=float(data["dense_bucket_max"]),
            raw_keys=bool(data.get("raw_keys", False)),
        )


def _schema_dict(schema: LogSchema) -> dict[str, Any]:
    return {f.name: _plain(getattr(schema, f.name)) for f in dataclasses.fields(schema)}


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _field_text(column: str, value: Any, separator: str, inner: str | None) -> str:
    """The text of one field as the log would hold it (None -> empty: missing)."""
    if value is None:
        return ""
    if isinstance(value, list) and inner is not None:
        parts = [_field_text(column, v, separator, None) for v in value]
        if any(inner in p for p in parts):
            raise ValueError(f"a value of {column} holds its inner separator {inner!r}")
        return inner.join(parts)
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"field {column} must be a string or a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"field {column} must be a finite number, got {value}")
    text = value if isinstance(value, str) else repr(value)
    if separator in text or "\n" in text or "\r" in text:
        raise ValueError(f"field {column} holds the separator {separator!r} or a line break")
    return text


def _no_events(schema: LogSchema) -> pd.DataFrame:
    return schema.events_schema().empty_table().to_pandas()
