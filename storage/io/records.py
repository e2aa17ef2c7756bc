"""Files the product writes: a format version each, and readers that outlive the code that wrote them.

A persisted record (model.json, metrics.json, lineage.json, status.json, a bundle manifest, an SSD
shard's meta.json) names its format in its `format` field as `"<name>/<version>"`.  Its reader

- reads every version in `RecordFormat.reads`: the one this code writes and the older ones still on
  users' disks (a file written before the record had a `format` field counts as version `absent`);
- ignores the fields it does not know, at any depth (a newer writer's additions, a retired config key)
  and gives missing ones their defaults (`codec.decode(..., unknown="ignore")`); a wrong type still
  fails naming the key;
- refuses any other version with a `FormatError` naming the file, the version found, the versions it
  reads and what to do.

So a version number changes only when an old reader would misread the file (a field changes meaning or
type, a layout changes); a new optional field is not a new version.  What a user writes (the config
file, `--set`) stays strict: `codec.decode` with its default `unknown="error"`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
import fsspec.implementations.local

from storage.io import codec, fsio

C = TypeVar("C")


class FormatError(ValueError):
    """A persisted file is not of a format version this code reads; the message says what to do."""


@dataclass(frozen=True)
class RecordFormat:
    """One persisted record's format: its name, the version written, the versions read.

    Args:
        name: e.g. "ctr-pipeline-model"; the `format` field holds `<name>/<version>`.
        version: the version this code writes.
        reads: the versions this code reads (default: `version` alone).
        absent: the version of a file without a `format` field (written before it had one), or None
            when such a file is refused.
        fix: what to do with a file of an older version this code no longer reads.
        newer: what to do with a file of a newer version.
    """

    name: str
    version: int
    reads: tuple[int, ...] = ()
    absent: int | None = None
    fix: str = "write it again with this code"
    newer: str = "upgrade ctr-pipeline here to read it"

    @property
    def tag(self) -> str:
        """The `format` value this code writes."""
        return f"{self.name}/{self.version}"

    @property
    def readable(self) -> tuple[int, ...]:
        return self.reads or (self.version,)

    def describe(self) -> str:
        return ", ".join(f"{self.name}/{v}" for v in self.readable)

    def version_of(self, data: Mapping[str, Any], where: str) -> int:
        """The version of `data` (the content of the file `where`).

        Raises:
            FormatError: another record's format, or a version this code does not read.
        """
        found = data.get("format")
        if found is None and self.absent is not None:
            return self.absent
        name, _, number = str(found).rpartition("/")
        if name != self.name or not number.isdigit():
            raise FormatError(
                f"{where} has format {found!r}, not a {self.name} file; this code reads "
                f"{self.describe()}: check the path"
            )
        version = int(number)
        if version not in self.readable:
            if version > max(self.readable):
                raise FormatError(
                    f"{where} has format {found!r}, written by a newer ctr-pipeline; this code reads "
                    f"{self.describe()}: {self.newer}"
                )
            raise FormatError(
                f"{where} has format {found!r}, too old for this code, which reads {self.describe()}: {self.fix}"
            )
        return version


MANIFEST_FORMAT_KEY = "manifest_format"
"""Where a data directory's manifest (`_SUCCESS.json`) names its format: its `format` holds the log format."""


class CommittedManifest:
    """What every manifest of a committed directory has (`storage.io.fsio.commit_dir`): its `data` field, the data
    prefix on an object store, which the commit sets and the writer never does."""

    data: str | None

    def data_dir(self, final: str) -> str:
        """Where the files of the directory `final` this manifest commits are (`storage.io.fsio.data_dir`)."""
        return fsio.data_dir(final, {fsio.DATA: self.data} if self.data is not None else {})

    def to_dict(self) -> dict[str, Any]:
        """The manifest to commit (`storage.io.fsio.commit_dir`; without `data`, which the commit adds)."""
        out = codec.encode(self)
        del out["data"]
        return out


def read_record(cls: type[C], data: Any, *, fmt: RecordFormat, where: str, format_key: str = "format") -> C:
    """`cls` (a dataclass) from the content of a persisted file, checked against `fmt` and read tolerantly.

    Args:
        cls: the record's own small schema (not a live config class).
        data: the parsed JSON.
        fmt: the record's format.
        where: the file's path or URL, for messages.
        format_key: the field holding the format (a manifest's `MANIFEST_FORMAT_KEY`: the record read
            holds the version this code writes there, since it is read into today's schema).

    Raises:
        FormatError: not a JSON object, or a version this code does not read.
        codec.ConfigError: a known field has a value of the wrong type (the message names it).
    """
    if not isinstance(data, Mapping):
        raise FormatError(f"{where} is not a JSON object (got {type(data).__name__}); it is not a {fmt.name} file")
    fmt.version_of({"format": data.get(format_key)}, where)
    fields = dict(data) if format_key == "format" else {**data, format_key: fmt.tag}
    return codec.decode(cls, fields, prefix=f"{where}: ", unknown="ignore")


def read_manifest(cls: type[C], fs: Any, path: str, *, fmt: RecordFormat) -> C | None:
    """The manifest of the committed data directory `path` (on `fs`) as `cls`, or None when it is not committed.

    Raises:
        FormatError, codec.ConfigError: see `read_record`.
    """
    raw = fsio.read_manifest(fs, path)
    if raw is None:
        return None
    local = isinstance(fs, fsspec.implementations.local.LocalFileSystem)
    where = fsio.join(path if local else fs.unstrip_protocol(path), fsio.SUCCESS)
    return read_record(cls, raw, fmt=fmt, where=where, format_key=MANIFEST_FORMAT_KEY)
