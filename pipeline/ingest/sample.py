"""The first lines of a raw log file read with a schema: what `ctrpipe check-schema` prints and a run checks first.

`check_sample` parses a sample with the ingest parser (`pipeline.ingest.parse.parse_table`: the same rules, the
same quarantine reasons) and summarises every column of the file: its role in the schema, how often it is filled,
its distinct and most common values, and per role the label's positive share, the numbers' range or the
timestamps' span.  `check_inputs` is the run's preflight (`flows.cli.preflight`): every date to run has an input
file (unless `input.wait_s` waits for it), the first file's sample mostly fits the schema, and the small compressed
files read to their end (a truncated export).  Seconds, not a Dask cluster: a sample of `SAMPLE_LINES` lines of one
file, and at most `WHOLE_CHECK_BYTES` of compressed files read whole.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fsspec.utils import infer_compression

from pipeline.config import InputConfig
from pipeline.ingest import bad_rows
from pipeline.ingest.error import IngestError
from pipeline.ingest.input_wait import wait_for_input
from pipeline.ingest.parse import parse_table
from pipeline.ingest.readers import DECOMPRESS_ERRORS, READ_SIZE, line_chunks, open_input
from pipeline.schema import LogSchema, get_schema

SAMPLE_LINES = 1000
"""Lines of the sample: enough for every schema mistake to show, read in well under a second."""
TOP_VALUES = 3
WHOLE_CHECK_BYTES = 64 << 20
"""Compressed inputs are read to their end before a run, each up to a quarter of this and together up to this: a
truncated export fails in seconds rather than at ingest (larger files are left to ingest)."""


@dataclass(frozen=True)
class ColumnStats:
    """One column of the sample (or a time feature derived from its timestamp)."""

    name: str
    role: str
    """label, integer, float, categorical, multi-valued, timestamp, derived (a time feature) or dropped."""
    filled: float
    """Share of the lines long enough to hold the column whose field is not empty."""
    distinct: int
    top: tuple[str, ...]
    """The most common values, most common first."""
    note: str = ""
    """Per role: the label's positive share, the valid numbers' range, the valid timestamps' span."""


@dataclass(frozen=True)
class SampleCheck:
    """A sample's rows in numbers (read = valid + quarantined + dated elsewhere), its columns and its bad rows."""

    file: str
    date: str | None
    rows_read: int
    rows_valid: int
    rows_quarantined: int
    rows_other_dates: int
    reasons: dict[str, int]
    """Quarantined lines by reason category, most common first."""
    samples: dict[str, dict[str, Any]]
    """Reason category -> its first line (`pipeline.ingest.bad_rows`)."""
    columns: tuple[ColumnStats, ...]
    error: str = ""
    """Why the sample could not be parsed at all (a header of other columns), else empty."""

    @property
    def bad_share(self) -> float:
        return self.rows_quarantined / self.rows_read if self.rows_read else 0.0

    @property
    def fits(self) -> bool:
        """The schema reads the sample: it parsed, and fewer than `bad_rows.MOSTLY_BAD` of its lines are bad."""
        return not self.error and self.bad_share < bad_rows.MOSTLY_BAD

    def counts(self) -> str:
        share = f" ({self.bad_share:.2%})" if self.rows_quarantined else ""
        return (
            f"{self.rows_read} rows read = {self.rows_valid} valid + {self.rows_quarantined} quarantined{share} + "
            f"{self.rows_other_dates} dated elsewhere"
        )

    def problems(self, schema: LogSchema, *, fmt: str, format_key: str = "input.format") -> list[str]:
        """The sample's problems in ingest's words: the top reasons with a line each, then what to do."""
        if self.error:
            return [self.error]
        out = bad_rows.describe_reasons(self.reasons, self.samples)
        if self.reasons:
            out.append(
                bad_rows.advice(
                    self.reasons, self.samples, share=self.bad_share, schema=schema, format_key=format_key, fmt=fmt
                )
            )
        if self.date and self.rows_other_dates and not self.rows_valid and not self.rows_quarantined:
            out.append(f"no line of the sample is dated {self.date}: check timestamp.format and input.url")
        return out


def read_sample(url: str, *, lines: int = SAMPLE_LINES, storage_options: dict | None = None) -> bytes:
    """The first `lines` lines of `url` (decompressed per its name, as ingest reads it).

    Raises:
        IngestError(kind="corrupt_input"): a compressed file that does not decompress that far.
    """
    try:
        with open_input(url, storage_options) as f:
            for data, _ in line_chunks(f, lines, read_size=1 << 20):
                return data
    except DECOMPRESS_ERRORS as exc:
        if infer_compression(url) is None:
            raise
        raise _corrupt(url, exc) from exc
    return b""


def read_whole(url: str, storage_options: dict | None = None) -> None:
    """Decompress `url` to its end, keeping nothing.

    Raises:
        IngestError(kind="corrupt_input"): it is truncated or corrupt (ingest's message).
    """
    try:
        with open_input(url, storage_options) as f:
            while f.read(READ_SIZE):
                pass
    except DECOMPRESS_ERRORS as exc:
        raise _corrupt(url, exc) from exc


def _corrupt(url: str, exc: BaseException) -> IngestError:
    return IngestError(
        f"{url}: cannot decompress ({infer_compression(url)}): {exc}; the file is truncated or corrupt, fetch it again",
        kind="corrupt_input",
    )


def check_sample(data: bytes, schema: LogSchema, *, file: str, date: str | None = None) -> SampleCheck:
    """The sample `data` (the first lines of `file`) read with `schema`; rows of `date` only are valid when given."""
    try:
        parsed = parse_table(data, schema=schema, file=file)
    except ValueError as exc:  # line 1 is the header of other columns
        return SampleCheck(file, date, 0, 0, 0, 0, {}, {}, (), error=str(exc))
    reasons: Counter = Counter()
    samples: dict[str, dict[str, Any]] = {}
    bad_rows.tally(parsed.quarantine, reasons, samples)
    events = parsed.events
    other = 0
    if date is not None and schema.timestamp is not None and events.num_rows:
        day0 = int(np.datetime64(date, "s").astype(np.int64))
        ts = events.column("ts").to_numpy(zero_copy_only=False)
        other = int(((ts < day0) | (ts >= day0 + 86_400)).sum())
    return SampleCheck(
        file=file,
        date=date,
        rows_read=parsed.rows_read,
        rows_valid=events.num_rows - other,
        rows_quarantined=parsed.quarantine.num_rows,
        rows_other_dates=other,
        reasons=dict(reasons.most_common()),
        samples=samples,
        columns=tuple(_column_stats(data, schema, events)),
    )


def check_inputs(
    input: InputConfig,
    urls: dict[str, str],
    *,
    find: Callable[[str], list[dict[str, Any]]],
    lines: int = SAMPLE_LINES,
) -> SampleCheck | None:
    """A run's input check: every date's URL matches a file, and the first file's sample fits the schema.

    Args:
        input: the run's input section (`wait_s` > 0: a missing input is waited for at ingest, not refused).
        urls: date -> that date's input URL (`pipeline.ingest.stage.input_url`), for the dates to run.
        find: `find(url) -> fingerprints` of the files a URL matches (`pipeline.ingest.stage.find_inputs`).

    Returns:
        The sample's check, or None when no date's input is there yet (all to be waited for).

    Raises:
        FileNotFoundError: a date's URL matches no file (or its `input.done_file` is missing), without `wait_s`;
            the message is ingest's (`pipeline.ingest.input_wait`).
        IngestError(kind="corrupt_input"): a compressed file does not decompress to its end.
        ValueError: the sample does not fit the schema: the top reasons with a line each and what to fix.
    """
    first: tuple[str, str] | None = None
    budget = WHOLE_CHECK_BYTES
    for date, url in _distinct(urls):
        if input.wait_s > 0:
            files = find(url)
        else:
            files = wait_for_input(functools.partial(find, url), url=url, date=date, input=input)
        if files and first is None:
            first = (date, files[0]["url"])
        for f in files:
            size = f.get("size")
            if infer_compression(f["url"]) and isinstance(size, int) and size <= min(budget, WHOLE_CHECK_BYTES // 4):
                read_whole(f["url"], input.storage_options)
                budget -= size
    if first is None:
        return None
    schema = get_schema(input.format)
    date, file = first
    data = read_sample(file, lines=lines, storage_options=input.storage_options)
    check = check_sample(data, schema, file=file, date=date if _names_the_date(input.url) else None)
    if not check.fits:
        head = check.error or f"input.format {input.format} does not fit the first lines of {file}: {check.counts()}"
        rest = [] if check.error else check.problems(schema, fmt=input.format)
        raise ValueError("\n".join([head, *(f"  {p}" for p in rest), "  (`ctrpipe check-schema` shows every column)"]))
    return check


def _distinct(urls: dict[str, str]) -> Iterable[tuple[str, str]]:
    """(date, url) with each URL once (a URL without a date placeholder serves every date)."""
    seen: set[str] = set()
    for date, url in urls.items():
        if url not in seen:
            seen.add(url)
            yield date, url


def _names_the_date(url: str) -> bool:
    return not url or any(p in url for p in ("{date}", "{yyyymmdd}"))


def _column_stats(data: bytes, schema: LogSchema, events: pa.Table) -> list[ColumnStats]:
    """Every column of the file in order (the raw text of each line that splits into a possible count), then
    the time features."""
    text = data.decode("utf-8", errors="replace").removeprefix("\ufeff")
    rows = [line.removesuffix("\r").split(schema.separator) for line in text.split("\n") if line.strip()]
    if rows and tuple(rows[0]) == schema.columns:
        rows = rows[1:]
    rows = [r for r in rows if schema.required_fields <= len(r) <= len(schema.columns)]
    out = []
    for i, name in enumerate(schema.columns):
        values = [r[i] for r in rows if i < len(r)]
        counts = Counter(v for v in values if v)
        filled = sum(counts.values()) / len(values) if values else 0.0
        top = tuple(_short(v) for v, _ in counts.most_common(TOP_VALUES))
        out.append(ColumnStats(name, _role(schema, name), filled, len(counts), top, _note(schema, name, events)))
    for name in schema.time_features:
        derived = Counter(events.column(name).to_pylist()) if events.num_rows else Counter()
        top = tuple(str(v) for v, _ in derived.most_common(TOP_VALUES))
        out.append(ColumnStats(name, "derived", 1.0 if events.num_rows else 0.0, len(derived), top))
    return out


def _role(schema: LogSchema, name: str) -> str:
    if name == schema.label:
        return "label"
    if name == schema.timestamp:
        return "timestamp"
    if name in schema.dense:
        return "float" if name in schema.floats else "integer"
    if name in schema.multi_separator:
        return "multi-valued"
    return "categorical" if name in schema.categorical else "dropped"


def _note(schema: LogSchema, name: str, events: pa.Table) -> str:
    """The valid rows' label share, number range or time span (empty without valid rows)."""
    if not events.num_rows:
        return ""
    if name == schema.label:
        return f"{pc.mean(events.column('label')).as_py():.2%} positive"
    if name in schema.dense:
        low, high = pc.min_max(events.column(name)).values()
        return "" if low.as_py() is None else f"{low.as_py():g} .. {high.as_py():g}"
    if name == schema.timestamp:
        ts = pc.cast(events.column("ts"), pa.timestamp("s"))
        low, high = (v.as_py() for v in pc.min_max(ts).values())
        days = len(pc.unique(pc.cast(ts, pa.date32())))
        return f"{low:%Y-%m-%d %H:%M:%S} .. {high:%Y-%m-%d %H:%M:%S}, {days} date{'s' if days > 1 else ''}"
    return ""


def _short(value: str, width: int = 24) -> str:
    return value if len(value) <= width else value[: width - 3] + "..."
