"""Filesystem helpers shared by every stage: fsspec URLs, atomic commits, manifests.

Every writer in the project writes into a staging location and commits last,
so a crash at any point leaves the previous committed state readable:

- a directory output is written under `<final>.staging-<token>/` and then
  renamed into place, its `_SUCCESS.json` manifest written last;
- a single small file (a pointer such as `LATEST`) is written beside its
  target and renamed over it.

Readers trust a directory only when its `_SUCCESS.json` exists.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

SUCCESS = "_SUCCESS.json"
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def validate_date(value: str) -> str:
    """Return `value` if it is a real YYYY-MM-DD date; dates become paths, so nothing else is accepted."""
    if not isinstance(value, str) or not _DATE.match(value):
        raise ValueError(f"date must be YYYY-MM-DD, got {value!r}")
    try:
        _dt.date.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"date {value!r} is not a calendar date: {exc}") from exc
    return value


def date_range(start: str, end: str) -> list[str]:
    """Dates from start to end inclusive, in order."""
    a, b = _dt.date.fromisoformat(validate_date(start)), _dt.date.fromisoformat(validate_date(end))
    if b < a:
        raise ValueError(f"end date {end} is before start date {start}")
    return [(a + _dt.timedelta(days=i)).isoformat() for i in range((b - a).days + 1)]


def shift_date(date: str, days: int) -> str:
    return (_dt.date.fromisoformat(validate_date(date)) + _dt.timedelta(days=days)).isoformat()


def get_fs(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and the protocol-less path of `url` (a local path or any fsspec URL)."""
    fs, path = url_to_fs(url, **(storage_options or {}))
    return fs, path


def join(base: str, *parts: str) -> str:
    """Join URL or path segments with '/' (fsspec paths always use '/')."""
    out = base.rstrip("/")
    for p in parts:
        out = f"{out}/{p.strip('/')}"
    return out


def is_local(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> Path:
    if not is_local(url):
        raise ValueError(f"{url!r} is not a local path")
    return Path(url.removeprefix("file://"))


def staging_dir(fs: fsspec.AbstractFileSystem, final: str) -> str:
    """A fresh staging directory beside `final` (same filesystem, so the commit is a rename)."""
    path = f"{final.rstrip('/')}.staging-{uuid.uuid4().hex[:12]}"
    fs.makedirs(path, exist_ok=True)
    return path


def commit_dir(fs: fsspec.AbstractFileSystem, staging: str, final: str, manifest: dict[str, Any]) -> None:
    """Make `staging` visible as `final` with `manifest` as its `_SUCCESS.json`.

    The manifest is written into the staging directory last, then the directory
    replaces any previous `final` (which is moved aside first and removed after).
    On a local filesystem the window in which `final` is missing is one rename;
    on object stores, where rename is a copy, readers still see either no
    `_SUCCESS.json` or a complete directory, never a mix.
    """
    write_json(fs, f"{staging}/{SUCCESS}", manifest)
    old = None
    if fs.exists(final):
        old = f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:12]}"
        fs.mv(final, old, recursive=True)
    fs.mv(staging, final, recursive=True)
    if old is not None:
        fs.rm(old, recursive=True)


def remove_stale_staging(fs: fsspec.AbstractFileSystem, final: str) -> None:
    """Delete staging/old leftovers of earlier crashed writers of `final`."""
    parent, name = final.rstrip("/").rsplit("/", 1)
    if not fs.exists(parent):
        return
    for entry in fs.ls(parent, detail=False):
        base = entry.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(f"{name}.staging-") or base.startswith(f"{name}.old-"):
            fs.rm(entry, recursive=True)


def read_manifest(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any] | None:
    """The committed manifest of directory `path`, or None when it is not committed."""
    target = f"{path.rstrip('/')}/{SUCCESS}"
    if not fs.exists(target):
        return None
    return read_json(fs, target)


def write_json(fs: fsspec.AbstractFileSystem, path: str, obj: Any) -> None:
    with fs.open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    with fs.open(path, "r") as f:
        return json.load(f)


def write_text_atomic(fs: fsspec.AbstractFileSystem, path: str, text: str) -> None:
    """Replace the file at `path` so readers see the old or the new text, never a partial one."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    with fs.open(tmp, "w") as f:
        f.write(text)
    if isinstance(fs, LocalFileSystem):
        os.replace(tmp, path)  # atomic on POSIX
    else:
        fs.mv(tmp, path)


def code_version() -> str:
    """The package version plus the git commit of the checkout when there is one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("ctr-pipeline")
    except PackageNotFoundError:
        ver = "0+unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{ver}+g{sha}" if sha else ver
