"""The fields of a chunk of raw log lines, before any value is checked (`pipeline.ingest.parse`).

Fast path (`split_fast`): pyarrow's CSV reader splits the chunk into string columns (no quoting, empty =
null) when every line has exactly all columns.  A chunk with any structurally odd line (wrong field count,
blank, not UTF-8, a lone CR) is split line by line instead (`split_lines`), still vectorised.  Either way
the result is a `Fields`: each field's text on demand and the lines that are structurally bad.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from pipeline.schema import LogSchema

_CSV_BLOCK = 1 << 20
"""Bytes per block of pyarrow's CSV reader on the fast path (see `_fast_columns`)."""


@dataclass(slots=True)
class Fields:
    """A chunk cut into lines and fields: each field's text, and which lines are structurally bad."""

    n: int
    """Lines."""
    counts: np.ndarray
    """Fields per line."""
    undecodable: np.ndarray
    """Not UTF-8."""
    blank: np.ndarray
    bad_count: np.ndarray
    """Too few or too many fields."""
    column: Callable[[str], tuple[Any, np.ndarray]]
    """A field's text (null when missing or empty) and its presence mask; read through `col`."""
    raw_of: Callable[[int], str]
    """Line i as read (what the quarantine keeps)."""
    fast: bool
    """Split by pyarrow's CSV reader (no structurally bad line)."""
    typed: bool = False
    """The dense columns were read as float64 (the fast path's typed read): no text kept."""
    structural: np.ndarray = field(init=False)
    _cache: dict[str, tuple[Any, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.structural = self.undecodable | self.blank | self.bad_count

    def col(self, name: str) -> tuple[Any, np.ndarray]:
        """`column(name)`, split once."""
        if name not in self._cache:
            self._cache[name] = self.column(name)
        return self._cache[name]

    def text_of(self, name: str, i: int, schema: LogSchema) -> str:
        """Field `name` of line i as written ("" when missing)."""
        c = schema.columns.index(name)
        if self.typed:  # the typed reader keeps no text: split the raw line
            fields = self.raw_of(i).split(schema.separator)
            return fields[c] if c < len(fields) else ""
        return (self.col(name)[0][i].as_py() or "") if c < self.counts[i] else ""


def split_fast(data: bytes, end: int, schema: LogSchema) -> Fields | None:
    """`data[:end]` split by pyarrow's CSV reader (`_fast_columns`: typed first, then as text when a dense value is
    not a number), or None when a line is structurally odd."""
    table = _fast_columns(data, end, schema, typed=True)
    typed = table is not None
    if table is None:  # a dense value is not a number: keep the fast split, check values below
        table = _fast_columns(data, end, schema, typed=False)
    if table is None:
        return None
    fast = table
    n = fast.num_rows
    none = np.zeros(n, dtype=bool)
    raw_lines: list[str] = []

    def column(name: str) -> tuple[pa.ChunkedArray, np.ndarray]:
        # kept in the reader's 1 MiB chunks: combining would copy every string column once more
        arr = fast.column(name)
        return arr, arr.is_valid().to_numpy(zero_copy_only=False)

    def raw_of(i: int) -> str:
        if not raw_lines:  # only for the rare bad rows of a fast chunk
            raw_lines.extend(line.removesuffix("\r") for line in data[:end].decode("utf-8").split("\n"))
        return raw_lines[i]

    counts = np.full(n, len(schema.columns), dtype=np.int64)
    return Fields(n, counts, none, none, none, column, raw_of, fast=True, typed=typed)


def split_lines(data: bytes, end: int, schema: LogSchema) -> Fields:
    """`data[:end]` split line by line (still vectorised): undecodable, blank and wrong-count lines marked."""
    lines, undecodable, raw_bad = _decode_lines(data[:end])
    n = len(lines)
    ncols = len(schema.columns)
    blank = ~undecodable & (pc.utf8_length(pc.utf8_trim_whitespace(lines)).to_numpy(zero_copy_only=False) == 0)
    split = pc.split_pattern(lines, schema.separator)
    counts = pc.list_value_length(split).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.asarray(split.offsets, dtype=np.int64)
    flat = pc.list_flatten(split)
    bad_count = ~undecodable & ~blank & ((counts < schema.required_fields) | (counts > ncols))

    def column(name: str) -> tuple[pa.Array, np.ndarray]:
        """Column `name` as strings (null when missing or empty) and its presence mask."""
        c = schema.columns.index(name)
        has = c < counts
        taken = flat.take(pa.array(np.where(has, offsets[:-1] + c, 0))) if len(flat) else pa.nulls(n, flat.type)
        present = has & (pc.utf8_length(taken).to_numpy(zero_copy_only=False) > 0)
        return pc.if_else(pa.array(present), taken, pa.scalar(None, taken.type)), present

    def raw_of(i: int) -> str:
        return raw_bad[i] if undecodable[i] else lines[i].as_py()

    return Fields(n, counts, undecodable, blank, bad_count, column, raw_of, fast=False)


def _fast_columns(data: bytes, end: int, schema: LogSchema, *, typed: bool) -> pa.Table | None:
    """The columns of `data[:end]` via pyarrow.csv, or None when a line is not a plain full row.

    All columns are strings, except with `typed` the dense ones, read as float64
    (then None also when a dense value is not a number).

    The row count must equal the newline count + 1: pyarrow also ends lines at
    a lone CR, which the per-line path keeps inside the line.

    The reader works in blocks of `_CSV_BLOCK` bytes, its default: a chunk of
    tens of MB read as one block parses slower, its working set no longer
    fitting in the CPU caches.  A line longer than a block fails the fast path
    and is parsed by the per-line path instead.
    """
    names = list(schema.columns)
    dense = set(schema.dense)
    if typed and not dense:
        return None
    try:
        table = pacsv.read_csv(
            pa.py_buffer(data).slice(0, end),
            read_options=pacsv.ReadOptions(column_names=names, use_threads=False, block_size=_CSV_BLOCK),
            parse_options=pacsv.ParseOptions(
                delimiter=schema.separator,
                quote_char=False,
                double_quote=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=False,
            ),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.float64() if typed and n in dense else pa.string() for n in names},
                null_values=[""],
                strings_can_be_null=True,
                check_utf8=True,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, UnicodeDecodeError):
        return None
    if table.num_rows != data.count(b"\n", 0, end) + 1:
        return None
    return table


def _decode_lines(data: bytes) -> tuple[pa.Array, np.ndarray, dict[int, str]]:
    """Lines of `data` (CR stripped), a not-UTF-8 mask, and the escaped text of such lines."""
    raw_bad: dict[int, str] = {}
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # rare: find the bad lines one by one
        parts = data.split(b"\n")
        decoded = []
        for i, part in enumerate(parts):
            try:
                decoded.append(part.decode("utf-8"))
            except UnicodeDecodeError:
                raw_bad[i] = part.removesuffix(b"\r").decode("utf-8", errors="backslashreplace")
                decoded.append("")
        text = "\n".join(decoded)
    lines = pc.list_flatten(pc.split_pattern(pa.array([text], pa.large_string()), "\n"))
    if "\r" in text:  # CRLF line ends
        lines = pc.utf8_rtrim(lines, characters="\r")
    undecodable = np.zeros(len(lines), dtype=bool)
    undecodable[list(raw_bad)] = True
    return lines, undecodable, raw_bad
