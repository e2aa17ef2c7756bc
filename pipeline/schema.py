"""The raw ad-log formats the pipeline reads, and the typed events they become.

A `LogSchema` says how one line of a raw log file splits into fields and which
field plays which role (label, dense numbers, categorical values, timestamp).
Everything downstream (parse, vocab, encode) is driven by it, so adding a
format means adding one schema here, or writing a YAML schema file
(`load_schema_file`, format documented there) and pointing `input.format` at it.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pyarrow as pa

_CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
_CRITEO_CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
_AVAZU_COLUMNS = (
    "id",
    "click",
    "hour",
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    "C14",
    "C15",
    "C16",
    "C17",
    "C18",
    "C19",
    "C20",
    "C21",
)
TIME_FEATURES = ("hour_of_day", "day_of_week")
"""Categorical fields a schema may derive from its timestamp (`time_features`, `time_feature_values`)."""
_WEEKDAYS = np.array(["mon", "tue", "wed", "thu", "fri", "sat", "sun"], dtype=object)


@dataclass(frozen=True, kw_only=True, slots=True)
class LogSchema:
    name: str
    """Format name as used in `input.format`."""
    separator: str
    """Field separator (no quoting: neither format quotes its fields)."""
    has_header: bool
    """Whether files of this format start with a header line naming `columns`."""
    columns: tuple[str, ...]
    """All column names in file order."""
    label: str
    """The 0/1 click column."""
    dense: tuple[str, ...]
    """Integer-valued numeric columns (become float32 events columns, then d_i features)."""
    categorical: tuple[str, ...]
    """Categorical columns in field-index order: `categorical[j]` has feature-key field j."""
    timestamp: str | None = None
    """Column holding the event time, or None when rows carry none (Criteo)."""
    timestamp_format: str | None = None
    """strptime format of `timestamp` (interpreted as UTC), or `unix` / `unix_ms` for epoch numbers."""
    min_fields: int = 0
    """Fewest fields a row may have; rows with fewer but at least this many are padded
    with missing trailing fields (real Criteo copies strip trailing empty fields).
    0 means all columns are required."""
    label_positive: tuple[str, ...] = ("1",)
    """Label texts that mean a click."""
    label_negative: tuple[str, ...] = ("0",)
    """Label texts that mean no click; any other label text is quarantined."""
    floats: tuple[str, ...] = ()
    """The members of `dense` that are real-valued rather than integer (only changes error messages)."""
    multi_valued: tuple[tuple[str, str], ...] = ()
    """(column, inner separator) of categorical columns holding a list of values in one field;
    they become list<string> events columns and bags of keys in features (`bag_<j>`)."""
    time_features: tuple[str, ...] = ()
    """Members of `categorical` derived from `timestamp` rather than read from a column (`TIME_FEATURES`):
    the parser writes them (`time_feature_values`), so ingest and scoring derive them alike."""

    def __post_init__(self) -> None:
        known = set(self.columns)
        derived = set(self.time_features)
        for role in (self.label, *self.dense, *(c for c in self.categorical if c not in derived)):
            if role not in known:
                raise ValueError(f"schema {self.name}: column {role!r} is not in columns {self.columns}")
        if self.timestamp is not None and (self.timestamp not in known or not self.timestamp_format):
            raise ValueError(f"schema {self.name}: timestamp {self.timestamp!r} needs a column and a format")
        if len(self.categorical) >= 128:
            raise ValueError(f"schema {self.name}: at most 127 categorical fields fit the 7-bit field index")
        if not 0 <= self.min_fields <= len(self.columns):
            raise ValueError(f"schema {self.name}: min_fields {self.min_fields} out of range")
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"schema {self.name}: duplicate column names in {self.columns}")
        overlap = set(self.label_positive) & set(self.label_negative)
        if not self.label_positive or not self.label_negative or overlap:
            raise ValueError(
                f"schema {self.name}: label positive {self.label_positive} and negative {self.label_negative} "
                "values must be non-empty and disjoint"
            )
        for name, inner in self.multi_valued:
            if name not in self.categorical:
                raise ValueError(f"schema {self.name}: multi-valued column {name!r} must be categorical")
            if not inner or inner == self.separator:
                raise ValueError(
                    f"schema {self.name}: multi-valued column {name!r} needs an inner separator "
                    f"other than the field separator {self.separator!r}"
                )
        if not set(self.floats) <= set(self.dense):
            raise ValueError(f"schema {self.name}: float columns {self.floats} must be dense columns")
        self._check_time_features()

    def _check_time_features(self) -> None:
        for name in self.time_features:
            if name not in TIME_FEATURES:
                raise ValueError(
                    f"schema {self.name}: unknown time feature {name!r}; known: {', '.join(TIME_FEATURES)}"
                )
            if self.timestamp is None:
                raise ValueError(f"schema {self.name}: time feature {name!r} needs a timestamp column")
            if name in self.columns or name not in self.categorical or name in self.multi_separator:
                raise ValueError(
                    f"schema {self.name}: time feature {name!r} must be a categorical field and not a column name"
                )

    @property
    def required_fields(self) -> int:
        return self.min_fields or len(self.columns)

    @property
    def multi_separator(self) -> dict[str, str]:
        """Multi-valued column -> its inner separator."""
        return dict(self.multi_valued)

    @property
    def reads_timestamp(self) -> bool:
        """Whether a feature is derived from `timestamp` (then a scoring request must carry it); otherwise the
        timestamp only dates rows."""
        return bool(self.time_features)

    @property
    def request_columns(self) -> tuple[str, ...]:
        """The columns the model reads, in file order: every feature column (dense, categorical, multi-valued)
        and the timestamp when a feature reads it.  A scoring request may leave out every other column."""
        used = {*self.dense, *self.categorical, *((self.timestamp,) if self.reads_timestamp else ())}
        return tuple(c for c in self.columns if c in used)

    def digest(self) -> str:
        """A short hash of what the schema says (fields left at their defaults are left out, so a field added
        later does not change it): committed events parsed with another schema of the same name are stale."""
        said = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}
        return hashlib.sha256(json.dumps(said, sort_keys=True).encode()).hexdigest()[:16]

    def events_schema(self) -> pa.Schema:
        """Arrow schema of the events Parquet (docs/formats.md, "events")."""
        multi = self.multi_separator
        return pa.schema(
            [("label", pa.int8()), ("ts", pa.int64()), ("order", pa.int64())]
            + [(c, pa.float32()) for c in self.dense]
            + [(c, pa.list_(pa.string()) if c in multi else pa.string()) for c in self.categorical]
        )


CRITEO = LogSchema(
    name="criteo",
    separator="\t",
    has_header=False,
    columns=("label", *_CRITEO_DENSE, *_CRITEO_CATEGORICAL),
    label="label",
    dense=_CRITEO_DENSE,
    categorical=_CRITEO_CATEGORICAL,
    min_fields=1 + len(_CRITEO_DENSE),
)

AVAZU = LogSchema(
    name="avazu",
    separator=",",
    has_header=True,
    columns=_AVAZU_COLUMNS,
    label="click",
    dense=(),
    categorical=tuple(c for c in _AVAZU_COLUMNS if c not in ("id", "click", "hour")),
    timestamp="hour",
    timestamp_format="%y%m%d%H",
)

SCHEMAS = {s.name: s for s in (CRITEO, AVAZU)}


def time_feature_values(name: str, seconds: np.ndarray) -> pa.Array:
    """The values of time feature `name` (`TIME_FEATURES`) of events at `seconds` since the epoch.

    The time is the timestamp's own: the wall clock a strptime pattern's text states (read as UTC, so its
    hours are the text's), UTC for unix numbers.  `hour_of_day`: "0".."23"; `day_of_week`: "mon".."sun".
    """
    if name == "hour_of_day":
        return pa.array(((seconds // 3600) % 24).astype(str), pa.string())
    if name == "day_of_week":
        return pa.array(_WEEKDAYS[(seconds // 86_400 + 3) % 7], pa.string())  # 1970-01-01 was a Thursday
    raise ValueError(f"unknown time feature {name!r}; known: {', '.join(TIME_FEATURES)}")


SCHEMA_FILE_SUFFIXES = (".yaml", ".yml")


def is_schema_file(fmt: str) -> bool:
    return fmt.lower().endswith(SCHEMA_FILE_SUFFIXES)


def get_schema(fmt: str | LogSchema) -> LogSchema:
    """The schema of format `fmt`: `criteo`, `avazu`, or a path/URL of a YAML schema file."""
    if isinstance(fmt, LogSchema):
        return fmt
    if is_schema_file(fmt):
        return load_schema_file(fmt)
    try:
        return SCHEMAS[fmt]
    except KeyError:
        raise ValueError(
            f"unknown log format {fmt!r}; known formats: {sorted(SCHEMAS)} or a schema file ending in .yaml/.yml"
        ) from None


@functools.lru_cache(maxsize=32)
def load_schema_file(url: str) -> LogSchema:
    """Read a YAML schema file describing an ad log no code here knows.

    Example (every key but `columns`, `label` and one feature list is optional)::

        name: shop_clicks          # recorded in manifests (default: the file name)
        separator: ";"             # default "\t"; "\\t" and "tab" also mean tab
        header: true               # line 1 names the columns (default false)
        columns: [ts, clicked, price, ctr_prior, site, tags]   # every column, file order
        label: {column: clicked, positive: ["1", "yes"], negative: ["0", "no"]}  # or just: clicked
        timestamp: {column: ts, format: "%Y-%m-%d %H:%M:%S"}   # or format: unix | unix_ms;
                                   # omit to date rows by the {date} in input.url (the file name)
        integer: [price]           # -> float32 events columns and d_i features
        float: [ctr_prior]
        categorical: [site]        # field index = position (multi-valued ones follow unless listed)
        multi_valued: {tags: "|"}  # column -> inner separator: a list of values in one field
        min_fields: 0              # rows with fewer fields (but >= this) read missing trailing fields
        time_features: [hour_of_day, day_of_week]   # categorical fields derived from the timestamp
                                   # (after categorical and multi_valued unless listed in categorical)

    Raises:
        ValueError: the file is not valid YAML or describes an inconsistent schema (the message says what).
    """
    import fsspec
    import yaml

    try:
        with fsspec.open(url, "r", encoding="utf-8") as f:
            spec = yaml.safe_load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"schema file {url} does not exist") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"schema file {url}: {yaml_error_text(exc)}") from exc
    return schema_from_dict(spec, default_name=url.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0], where=url)


def yaml_error_text(exc: Exception) -> str:
    """A YAML parse error on one line: `not valid YAML at line 2, column 1: <problem>` (PyYAML's spans several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    return f"not valid YAML{where}: {problem}"


_SCHEMA_KEYS = {
    "name",
    "separator",
    "header",
    "columns",
    "label",
    "timestamp",
    "integer",
    "float",
    "categorical",
    "multi_valued",
    "min_fields",
    "time_features",
}


def schema_from_dict(spec: Any, *, default_name: str = "custom", where: str = "schema") -> LogSchema:
    """A `LogSchema` from the mapping of a YAML schema file (see `load_schema_file`)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a schema file must be a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - _SCHEMA_KEYS)
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), sorted(_SCHEMA_KEYS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{where}: unknown key {unknown[0]!r}{hint}; known keys: {', '.join(sorted(_SCHEMA_KEYS))}")

    def names(key: str) -> tuple[str, ...]:
        value = spec.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{where}: {key} must be a list of column names, got {value!r}")
        return tuple(value)

    columns = names("columns")
    if not columns:
        raise ValueError(f"{where}: columns (every column name in file order) is required")
    sep = str(spec.get("separator", "\t"))
    sep = {"\\t": "\t", "tab": "\t"}.get(sep, sep)  # YAML '\t' in single quotes stays two characters
    label = spec.get("label")
    positive: tuple[str, ...] = ("1",)
    negative: tuple[str, ...] = ("0",)
    if isinstance(label, dict):
        positive = tuple(str(v) for v in label.get("positive", positive))
        negative = tuple(str(v) for v in label.get("negative", negative))
        label = label.get("column")
    if not isinstance(label, str):
        raise ValueError(f"{where}: label must be a column name or {{column, positive, negative}}, got {label!r}")
    ts = spec.get("timestamp")
    ts_column = ts_format = None
    if ts is not None:
        if not isinstance(ts, dict) or "column" not in ts or "format" not in ts:
            raise ValueError(f"{where}: timestamp must be {{column: NAME, format: STRPTIME|unix|unix_ms}}, got {ts!r}")
        ts_column, ts_format = str(ts["column"]), str(ts["format"])
    multi = spec.get("multi_valued") or {}
    if not isinstance(multi, dict):
        raise ValueError(f"{where}: multi_valued must map column -> inner separator, got {multi!r}")
    categorical = names("categorical")
    categorical += tuple(c for c in multi if c not in categorical)
    time_features = names("time_features")
    categorical += tuple(c for c in time_features if c not in categorical)
    integer, real = names("integer"), names("float")
    dense = tuple(c for c in columns if c in set(integer) | set(real))  # file order
    if not dense and not categorical:
        raise ValueError(f"{where}: no feature columns: list integer, float or categorical columns")
    try:
        return LogSchema(
            name=str(spec.get("name", default_name)),
            separator=sep,
            has_header=bool(spec.get("header", False)),
            columns=columns,
            label=label,
            dense=dense,
            categorical=categorical,
            timestamp=ts_column,
            timestamp_format=ts_format,
            min_fields=int(spec.get("min_fields", 0)),
            label_positive=positive,
            label_negative=negative,
            floats=real,
            multi_valued=tuple((str(k), str(v)) for k, v in multi.items()),
            time_features=time_features,
        )
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
