"""Raw log lines -> typed events + quarantined lines (pure: bytes in, Arrow tables or DataFrames out).

One call parses a chunk of consecutive complete lines of one file.  The common
path splits the chunk with pyarrow's CSV reader (C++, no quoting) and checks
values with pyarrow compute; a chunk holding any structurally odd line (wrong
field count, blank, not UTF-8) is split line by line instead, still
vectorised.  Python loops only touch the rare bad lines, to write their
quarantine reason.

Every non-header line ends up in exactly one place, so for any chunk
    rows_read = len(events) + len(quarantine) + rows_other_dates
A line is quarantined, first matching rule wins, for:
  undecodable bytes (not UTF-8) | blank line | wrong field count |
  bad timestamp | bad label (not a label value of the schema) | non-numeric integer/float field.
Quirks accepted as valid: CRLF line ends, a UTF-8 BOM on line 1, a header on
line 1, integers written as floats (`260.0`), and (Criteo) stripped trailing
empty fields, which are read as missing; such "padded" rows are counted
(`rows_padded`), so a day of cut rows shows in the data checks.  Fields are never quoted in either
format, so the separator is never escaped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest.fields import Fields, split_fast, split_lines
from pipeline.schema import LogSchema, get_schema, time_feature_values

ORDER_FILE_SHIFT = 40
"""events.order = file_index << 40 | line number: time order within a day."""
QUARANTINE_SCHEMA = pa.schema(
    [("file", pa.string()), ("line", pa.int64()), ("raw", pa.string()), ("reason", pa.string())]
)
_NUMBER_PATTERN = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"  # "260.0": an integer written as a float
SEPARATORS = ("\t", ",", ";", "|")
"""Separators tried on a line that does not split into the schema's columns, to name the likely mistake."""
_DAY_SECONDS = 86_400


@dataclass(frozen=True, slots=True)
class ParsedChunk:
    events: pd.DataFrame
    """Valid rows (of `date` when one was given), columns per `LogSchema.events_schema`."""
    quarantine: pd.DataFrame
    """Rejected lines: file, line (1-based line number in the file), raw, reason."""
    rows_read: int
    """Non-header lines in the chunk."""
    rows_other_dates: int
    """Valid-timestamp rows of another date than the one asked for (dropped)."""


@dataclass(frozen=True, slots=True)
class ParsedTable:
    """`ParsedChunk` as Arrow tables: what ingest writes, with no pandas conversion of strings."""

    events: pa.Table
    quarantine: pa.Table
    rows_read: int
    rows_other_dates: int
    fast_path: bool
    """True when the chunk was split by pyarrow's CSV reader (no structurally bad line in it)."""
    rows_padded: int = 0
    """Valid rows with fewer fields than the schema's columns (missing trailing fields)."""


def reason_category(reason: str) -> str:
    """The rule part of a quarantine reason ("bad label: '2'" -> "bad label"), for summaries."""
    return reason.split(":", 1)[0]


def parse_chunk(
    data: bytes,
    *,
    schema: LogSchema,
    file: str,
    file_index: int = 0,
    first_line: int = 1,
    date: str | None = None,
) -> ParsedChunk:
    """Parse consecutive complete lines `data` of `file`, starting at line `first_line`.

    Args:
        data: the raw bytes of whole lines (the last one may lack its newline).
        schema: the log format.
        file: the file's URL, written into quarantine rows.
        file_index: position of the file in the day's sorted inputs (for `order`).
        first_line: 1-based line number in the file of the first line of `data`;
            only a chunk starting at line 1 may hold a BOM or a header.
        date: keep only rows whose timestamp falls on this YYYY-MM-DD (UTC) and
            count the others as `rows_other_dates`; ignored for formats without
            timestamps.

    Raises:
        ValueError: line 1 of a format with a header is a header for other columns.
    """
    t = parse_table(data, schema=schema, file=file, file_index=file_index, first_line=first_line, date=date)
    events = t.events.to_pandas()
    events["ts"] = events["ts"].astype("Int64")
    return ParsedChunk(
        events=events, quarantine=t.quarantine.to_pandas(), rows_read=t.rows_read, rows_other_dates=t.rows_other_dates
    )


def parse_table(
    data: bytes,
    *,
    schema: LogSchema,
    file: str,
    file_index: int = 0,
    first_line: int = 1,
    date: str | None = None,
) -> ParsedTable:
    """`parse_chunk` returning Arrow tables (same arguments, same rules).

    Fast path: pyarrow's CSV reader splits the chunk into string columns (no
    quoting, empty = null) when every line has exactly all columns; a chunk
    with any structurally odd line (wrong field count, blank, not UTF-8, a lone
    CR) falls back to the per-line split (`pipeline.ingest.fields`).  Value rules (label,
    timestamp, numbers) are vectorised on both paths.
    """
    data, first_line = _without_bom_and_header(data, first_line, schema, file)
    end = len(data) - 1 if data.endswith(b"\n") else len(data)  # the final newline ends no extra line
    if end == 0:
        return _empty_table(schema)
    fields = split_fast(data, end, schema) or split_lines(data, end, schema)
    line_no = first_line + np.arange(fields.n, dtype=np.int64)
    checked = _check_values(fields, schema, date)
    good = checked.good
    events = _events_table(schema, good, checked.is_one, checked.ts, file_index, line_no, checked.dense, fields.col)
    bad_rows = np.flatnonzero(~good & ~checked.other_date)
    quarantine = pa.table(
        {
            "file": pa.array([file] * len(bad_rows), pa.string()),
            "line": pa.array(line_no[bad_rows].astype(np.int64), pa.int64()),
            "raw": pa.array([fields.raw_of(int(i)) for i in bad_rows], pa.string()),
            "reason": pa.array([_reason(int(i), fields, checked, schema) for i in bad_rows], pa.string()),
        },
        schema=QUARANTINE_SCHEMA,
    )
    return ParsedTable(
        events=events,
        quarantine=quarantine,
        rows_read=fields.n,
        rows_other_dates=int(checked.other_date.sum()),
        fast_path=fields.fast,
        rows_padded=int((good & (fields.counts < len(schema.columns))).sum()),
    )


def _without_bom_and_header(data: bytes, first_line: int, schema: LogSchema, file: str) -> tuple[bytes, int]:
    """(`data` without a UTF-8 BOM and a header line, its first line number): only a chunk at line 1 has them.

    Raises:
        ValueError: line 1 of a format with a header is a header for other columns (`_is_header`).
    """
    if first_line == 1 and data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if first_line == 1 and data:
        nl = data.find(b"\n")
        head = data[: nl if nl >= 0 else len(data)]
        try:
            head_text = head.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError:
            head_text = None
        if head_text is not None and _is_header(head_text, schema, file):
            return (data[nl + 1 :] if nl >= 0 else b""), 2
    return data, first_line


@dataclass(frozen=True, slots=True)
class _Checked:
    """The value rules' verdict on a chunk's lines (each rule only on the lines no earlier rule rejected)."""

    ts: np.ndarray
    """Seconds since the epoch (0 without a timestamp)."""
    bad_ts: np.ndarray
    other_date: np.ndarray
    """A valid timestamp of another date than the one asked for."""
    is_one: np.ndarray
    """A positive label."""
    bad_label: np.ndarray
    dense: dict[str, np.ndarray]
    """float32 values of each dense field (NaN when missing)."""
    first_bad_dense: np.ndarray
    """Index in `schema.dense` of a line's first non-numeric dense value, -1 when none."""
    good: np.ndarray
    """Lines that become events."""


def _check_values(fields: Fields, schema: LogSchema, date: str | None) -> _Checked:
    """Timestamp, date, label and number rules, in that order, over the structurally sound lines."""
    n, structural, col = fields.n, fields.structural, fields.col
    ts = np.zeros(n, dtype=np.int64)
    bad_ts = np.zeros(n, dtype=bool)
    other_date = np.zeros(n, dtype=bool)
    if schema.timestamp is not None:
        text, present = col(schema.timestamp)
        ok, ts = _timestamps(text, schema.timestamp_format)
        ok &= present
        bad_ts = ~structural & ~ok
        if date is not None:
            day0 = int(np.datetime64(date, "s").astype(np.int64))
            other_date = ~structural & ok & ((ts < day0) | (ts >= day0 + _DAY_SECONDS))
    rest = structural | bad_ts | other_date

    label_text, _ = col(schema.label)
    is_one = _is_in(label_text, schema.label_positive)
    is_zero = _is_in(label_text, schema.label_negative)
    bad_label = ~rest & ~(is_one | is_zero)
    rest |= bad_label

    dense: dict[str, np.ndarray] = {}
    first_bad_dense = np.full(n, -1, dtype=np.int64)
    for i, name in enumerate(schema.dense):
        text, present = col(name)
        if fields.typed:  # already float64 from the CSV reader
            values = text.to_numpy(zero_copy_only=False)
            numeric = np.isfinite(values)
            values = np.where(numeric, values, np.nan).astype(np.float32)
        else:
            values, numeric = _to_numbers(text)
        bad = present & ~numeric
        first_bad_dense[(first_bad_dense < 0) & bad & ~rest] = i
        dense[name] = values
    good = ~(rest | (first_bad_dense >= 0))
    return _Checked(ts, bad_ts, other_date, is_one, bad_label, dense, first_bad_dense, good)


def _reason(i: int, fields: Fields, checked: _Checked, schema: LogSchema) -> str:
    """Why line i is quarantined, with the offending value: the rare path, one Python step per rejected line."""
    ncols = len(schema.columns)
    if fields.undecodable[i]:
        return "undecodable bytes: not UTF-8"
    if fields.blank[i]:
        return "blank line"
    if fields.bad_count[i]:
        want = f"{ncols}" if schema.required_fields == ncols else f"{schema.required_fields}..{ncols}"
        return f"wrong field count: {fields.counts[i]} fields, expected {want}"
    if checked.bad_ts[i]:
        return (
            f"bad timestamp: {schema.timestamp}={fields.text_of(schema.timestamp, i, schema)!r}, "  # type: ignore[arg-type]  # bad_ts: it has one
            f"expected format {schema.timestamp_format!r}"
        )
    if checked.bad_label[i]:
        allowed = " or ".join((*schema.label_positive, *schema.label_negative))
        return f"bad label: {schema.label}={fields.text_of(schema.label, i, schema)!r}, expected {allowed}"
    name = schema.dense[checked.first_bad_dense[i]]
    kind = "float" if name in schema.floats else "integer"
    return f"non-numeric {kind} field: {name}={fields.text_of(name, i, schema)!r}"


def _is_in(text: pa.Array, values: tuple[str, ...]) -> np.ndarray:
    if len(values) == 1:
        return pc.equal(text, values[0]).fill_null(False).to_numpy(zero_copy_only=False)
    return pc.is_in(text, value_set=pa.array(values, text.type)).fill_null(False).to_numpy(zero_copy_only=False)


def _timestamps(text: pa.Array, fmt: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, int64 seconds since epoch) of a timestamp text column."""
    if fmt in ("unix", "unix_ms"):
        values, ok = _to_numbers(text, dtype=np.float64)
        seconds = np.floor(np.nan_to_num(values / (1000.0 if fmt == "unix_ms" else 1.0)))
        ok &= np.abs(seconds) < 1e12
        return ok, np.where(ok, seconds, 0).astype(np.int64)
    parsed = pc.strptime(text, format=fmt, unit="s", error_is_null=True)
    ok = parsed.is_valid().to_numpy(zero_copy_only=False)
    return ok, pc.cast(parsed, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _to_numbers(text: pa.Array, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """`dtype` values of a string column (NaN where null or bad) and a mask of finite numbers."""
    try:  # fast path: the whole column casts
        values = pc.cast(text, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:  # rare: locate the bad values, cast the rest
        numeric = pc.match_substring_regex(text, _NUMBER_PATTERN).fill_null(False).to_numpy(zero_copy_only=False)
        values = pc.cast(pc.if_else(pa.array(numeric), text, pa.scalar(None, text.type)), pa.float64())
        values = values.to_numpy(zero_copy_only=False)
    finite = np.isfinite(values)
    return np.where(finite, values, np.nan).astype(dtype), finite


def _is_header(first: str, schema: LogSchema, file: str) -> bool:
    fields = first.split(schema.separator)
    if tuple(fields) == schema.columns:
        return True
    label_pos = schema.columns.index(schema.label)
    labels = (*schema.label_positive, *schema.label_negative)
    if schema.has_header and (len(fields) <= label_pos or fields[label_pos] not in labels):
        for sep in SEPARATORS:
            if sep != schema.separator and tuple(first.split(sep)) == schema.columns:
                raise ValueError(
                    f"{file}: line 1 is the header of the {schema.name} columns split on {sep!r}, but the format's "
                    f"separator is {schema.separator!r}: set separator: {sep!r} in the schema file (or check "
                    "input.format)"
                )
        shown = fields if len(fields) <= 8 else [*fields[:8], "..."]
        raise ValueError(
            f"{file}: line 1 looks like a header but its {len(fields)} field(s) {shown} are not the {schema.name} "
            f"columns {list(schema.columns)}; check input.format or the file"
        )
    return False


def _events_table(
    schema: LogSchema,
    good: np.ndarray,
    is_one: np.ndarray,
    ts: np.ndarray,
    file_index: int,
    line_no: np.ndarray,
    dense: dict[str, np.ndarray],
    col,
) -> pa.Table:
    """The events rows `good`, columns per `LogSchema.events_schema` (`col(name)` gives a field's text)."""
    everything = bool(good.all())
    keep = np.flatnonzero(good)
    take = None if everything else pa.array(keep)

    def pick(arr):
        return arr if take is None else arr.take(take)

    out_schema = schema.events_schema()
    multi = schema.multi_separator
    arrays: list[pa.Array] = [
        pa.array(is_one[keep].astype(np.int8)),
        pa.array(ts[keep], pa.int64()) if schema.timestamp else pa.nulls(len(keep), pa.int64()),
        pa.array((np.int64(file_index) << ORDER_FILE_SHIFT) + line_no[keep]),
    ]
    arrays += [pa.array(dense[name][keep], pa.float32()) for name in schema.dense]
    derived = set(schema.time_features)
    for name in schema.categorical:
        if name in derived:  # hour_of_day, ...: from the row's timestamp, never missing on a valid row
            arrays.append(time_feature_values(name, ts[keep]))
            continue
        text = pc.cast(pick(col(name)[0]), pa.string())
        if name in multi:  # "a|b|c" -> ["a", "b", "c"]; a missing field stays null
            text = pc.split_pattern(text, multi[name])
        arrays.append(text)
    return pa.Table.from_arrays(arrays, schema=out_schema)


def _empty_table(schema: LogSchema) -> ParsedTable:
    return ParsedTable(
        events=schema.events_schema().empty_table(),
        quarantine=QUARANTINE_SCHEMA.empty_table(),
        rows_read=0,
        rows_other_dates=0,
        fast_path=True,
    )


def read_log_file(url: str, fmt: str, storage_options: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Events and quarantine of one small log file, read whole (gzip/bz2 inferred from the name).

    Meant for ad-hoc evaluation on a sample file; the daily ingest streams files instead.
    """
    import fsspec

    with fsspec.open(url, "rb", compression="infer", **(storage_options or {})) as f:
        data = f.read()
    parsed = parse_chunk(data, schema=get_schema(fmt), file=url)
    return parsed.events, parsed.quarantine
