"""Request entries -> lines of the model's format: positional lines read by their field count, named columns.

What a server gets at request time is features only, often fewer columns than the log had.  A positional line
is read by its field count, each count meaning one of these (`LogSchema.request_columns`: the columns the
model reads; the label, dropped columns and the timestamp, unless a feature reads it, may be left out):

    len(columns)                        labelled (replay, parity checks)
    len(columns) - 1                    every column but the label
    len(request_columns)                only the columns the model reads, in file order
    len(request_columns) + 1            those and the timestamp (a request log's natural line)
    min_fields..len(columns) - 1        labelled, cut short (a format that strips trailing empty fields, as
                                        Criteo's `min_fields`; ingest pads them)

A count with two meanings (Criteo's 39: a labelled line cut by one, or a line without the label) is refused
naming both, unless the request says `"labelled": true` or `false`, which also lets a features-only line be cut
short.  Any other count is refused, "wrong field count: ...", naming the counts accepted.  Named columns (rows
of JSON objects, CSV with a header: `csv_rows`) need no count.

Every entry becomes a whole labelled line of the format, which the feature path (and the small-batch path)
reads: the label written in where missing (the schema's first negative value, never used), missing columns
empty, and the timestamp, when no feature reads it, replaced by `placeholder_timestamp`: it only dates rows,
so a request need not send it and a value sent is not checked.
"""

from __future__ import annotations

import csv
import functools
import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.encode.feature_spec import FeatureSpec
from pipeline.schema import LogSchema


@dataclass(frozen=True)
class Reading:
    """One meaning of a field count: which column each field is."""

    what: str
    """In words, for the refusal of an ambiguous count."""
    at: tuple[int, ...]
    """The column index of each field, in order."""
    labelled: bool


@dataclass(frozen=True)
class _Layout:
    """A schema's readings by field count (for `"labelled"` absent, true, false) and how lines are written."""

    readings: dict[bool | None, dict[int, tuple[Reading, ...]]]
    whole: tuple[int, ...]
    """Every column in order: a labelled line of the format."""
    label_at: int
    ts_at: int | None
    """The timestamp's column when no feature reads it (replaced by the placeholder), else None."""
    placeholder: str


def placeholder_timestamp(schema: LogSchema) -> str:
    """A valid timestamp of the schema's format (the epoch), written where a request leaves the time out."""
    fmt = schema.timestamp_format
    if fmt in ("unix", "unix_ms"):
        return "0"
    return time.strftime(fmt or "%Y", time.gmtime(0))


@functools.lru_cache(maxsize=64)
def layout(schema: LogSchema) -> _Layout:
    """The readings of every field count of `schema` (see the module docstring)."""
    cols, ncols = schema.columns, len(schema.columns)
    label_at, least = cols.index(schema.label), schema.required_fields
    label = schema.label
    unlabelled = tuple(i for i in range(ncols) if i != label_at)
    used = tuple(cols.index(c) for c in schema.request_columns)
    with_label = [Reading("a labelled line", tuple(range(ncols)), True)]
    with_label += [
        Reading(f"a labelled line cut short (its last {_empty_fields(ncols - n)} dropped)", tuple(range(n)), True)
        for n in range(max(least, label_at + 1), ncols)
    ]
    without = [
        Reading(f"a line without the label column {label!r}", unlabelled, False),
        Reading("the columns the model reads", used, False),
    ]
    ts = schema.timestamp
    if ts is not None and not schema.reads_timestamp:
        stamped = tuple(sorted((*used, cols.index(ts))))
        without.append(Reading(f"the columns the model reads and the timestamp {ts!r}", stamped, False))
    cut = [
        Reading(f"a line without the label column {label!r}, cut short", unlabelled[:n], False)
        for n in range(max(least - 1, 1), ncols - 1)
    ]
    return _Layout(
        readings={None: _by_count(with_label + without), True: _by_count(with_label), False: _by_count(without + cut)},
        whole=tuple(range(ncols)),
        label_at=label_at,
        ts_at=cols.index(ts) if ts is not None and not schema.reads_timestamp else None,
        placeholder=placeholder_timestamp(schema),
    )


def _empty_fields(k: int) -> str:
    return "empty field" if k == 1 else f"{k} empty fields"


def _by_count(readings: list[Reading]) -> dict[int, tuple[Reading, ...]]:
    """Field count -> its distinct readings (two readings of the same columns are one)."""
    out: dict[int, dict[tuple[int, ...], Reading]] = {}
    for r in readings:
        out.setdefault(len(r.at), {}).setdefault(r.at, r)
    return {n: tuple(found.values()) for n, found in out.items()}


def with_labels(
    lines: Sequence[str], schema: LogSchema, *, labelled: bool | None = None
) -> tuple[list[str | None], list[tuple[int, str]]]:
    """The lines as whole labelled lines of the format (None where refused), and (index, reason) of the refused ones.

    Args:
        lines: raw request lines.
        schema: the model's log format.
        labelled: None: by field count (see the module docstring); True: every line carries the label (a count
            of no labelled reading goes to the parser as it is, which says why); False: no line does.
    """
    lay = layout(schema)
    by_count = lay.readings[labelled]
    sep, fill = schema.separator, schema.label_negative[0]
    out: list[str | None] = []
    errors: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        n = line.count(sep) + 1
        found = by_count.get(n, ())
        if "\n" in line or "\r" in line or not line.strip() or (labelled is True and not found):
            out.append(line)  # the feature path refuses it with its own reason
        elif len(found) == 1:
            out.append(_written(line, found[0], lay, sep, fill))
        else:
            out.append(None)
            errors.append((i, ambiguous_reason(n, found) if found else field_count_reason(n, schema, labelled)))
    return out, errors


def _written(line: str, reading: Reading, lay: _Layout, sep: str, fill: str) -> str:
    """`line` read as `reading`, as a whole labelled line of the format."""
    if reading.at == lay.whole and lay.ts_at is None:
        return line
    values = [""] * len(lay.whole)
    for at, value in zip(reading.at, line.split(sep), strict=True):
        values[at] = value
    if not reading.labelled:
        values[lay.label_at] = fill
    if lay.ts_at is not None:
        values[lay.ts_at] = lay.placeholder
    return sep.join(values)


def ambiguous_reason(n: int, readings: Sequence[Reading]) -> str:
    """The reason a line of `n` fields with several readings is refused, naming them and what settles it."""
    said = " or ".join(r.what for r in readings)
    if len({r.labelled for r in readings}) > 1:
        fix = 'say "labelled": true or false beside "lines", or name the columns'
    else:
        fix = 'name the columns ({"rows": [...]} or CSV with a header)'
    return f"ambiguous field count: {n} fields are {said}: {fix}"


def field_count_reason(n: int, schema: LogSchema, labelled: bool | None) -> str:
    """The reason a line of `n` fields is refused, naming the counts accepted (with and without the label)."""
    ncols, least = len(schema.columns), schema.required_fields
    with_label = f"{ncols}" if least == ncols else f"{least}..{ncols}"
    without = f"{ncols - 1}" if least == ncols or labelled is None else f"{least - 1}..{ncols - 1}"
    used = len(schema.request_columns)
    also = ""
    if used != ncols - 1:
        stamp = schema.timestamp is not None and not schema.reads_timestamp
        also = f" or {used} of the columns the model reads" + (
            f" ({used + 1} with the timestamp {schema.timestamp!r})" if stamp else ""
        )
    if labelled is False:
        return (
            f"wrong field count: {n} fields, expected {without} without the label column {schema.label!r}{also} "
            '(the request says "labelled": false)'
        )
    return (
        f"wrong field count: {n} fields, expected {with_label} with the label column {schema.label!r} "
        f"or {without} without it{also}"
    )


def rows_as_lines(
    rows: Sequence[Any], spec: FeatureSpec, refused: Sequence[tuple[int, str]] = ()
) -> tuple[list[str | None], list[tuple[int, str]]]:
    """Rows of named fields as whole labelled lines (`FeatureSpec.rows_to_lines`), the timestamp as for lines;
    the rows of `refused` (index, reason: a bad CSV record) stay None with their reason."""
    s = spec.schema
    if s.timestamp is not None and not s.reads_timestamp:
        stamp = placeholder_timestamp(s)
        rows = [{**r, s.timestamp: stamp} if isinstance(r, Mapping) else r for r in rows]
    if not refused:
        return spec.rows_to_lines(rows)
    bad = dict(refused)
    good = [i for i in range(len(rows)) if i not in bad]
    written, errors = spec.rows_to_lines([rows[i] for i in good])
    lines: list[str | None] = [None] * len(rows)
    for i, line in zip(good, written, strict=True):
        lines[i] = line
    return lines, sorted([(good[k], reason) for k, reason in errors] + list(bad.items()))


def csv_rows(text: str) -> tuple[list[dict[str, str] | None], list[tuple[int, str]]]:
    """The records of a CSV text whose first record names the columns, as rows of named fields (an empty value
    is missing; blank records are skipped), and (index, reason) of the records of another field count (None).

    Raises:
        ValueError: not CSV (a quote left open), or no header, or a header with an empty or repeated name.
    """
    try:
        records = [r for r in csv.reader(io.StringIO(text, newline=""), strict=True) if r]
    except csv.Error as exc:
        raise ValueError(f"invalid CSV: {exc}") from None
    if not records:
        raise ValueError("a CSV body starts with a header record naming the columns; the body is empty")
    header, *body = records
    if "" in header or len(set(header)) != len(header):
        raise ValueError(f"the CSV header must name each column once, got {header}")
    rows: list[dict[str, str] | None] = []
    errors: list[tuple[int, str]] = []
    for i, record in enumerate(body):
        if len(record) != len(header):
            rows.append(None)
            errors.append((i, f"wrong field count: {len(record)} fields, the CSV header names {len(header)}"))
        else:
            rows.append({k: v for k, v in zip(header, record, strict=True) if v != ""})
    return rows, errors
