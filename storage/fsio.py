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
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def staged(fs: fsspec.AbstractFileSystem, final: str) -> Iterator[str]:
    """A fresh staging directory for `final`, removed again if the block raises.

    Cleans up earlier crashed writers first (`remove_stale_staging`); the block
    writes into the yielded path and ends with `commit_dir`.
    """
    remove_stale_staging(fs, final)
    stage = staging_dir(fs, final)
    try:
        yield stage
    except BaseException:
        if fs.exists(stage):
            fs.rm(stage, recursive=True)
        raise


def commit_dir(fs: fsspec.AbstractFileSystem, staging: str, final: str, manifest: dict[str, Any]) -> None:
    """Make the files under `staging` the committed content of `final`, `_SUCCESS.json` last.

    Local filesystem: the manifest is written into the staging directory, the
    previous `final` is moved aside, the staging directory renamed into place
    and the old one removed.  A crash between the two renames leaves `final`
    missing and `<final>.old-*` complete; `remove_stale_staging` (which every
    writer calls first) moves it back.

    Object stores: a directory "rename" is a copy of each object in no fixed
    order, so the manifest could land before the data.  Instead: (1) remove
    the old manifest (readers stop trusting the old directory), (2) copy the
    staged files over, (3) delete files the new output does not have, (4)
    write `_SUCCESS.json` last, (5) remove the staging prefix.  Readers see no
    manifest or a complete directory, never a mix; unlike the local case the
    previous output is not readable during the commit window.
    """
    if not isinstance(fs, LocalFileSystem):
        _commit_by_copy(fs, staging.rstrip("/"), final.rstrip("/"), manifest)
        return
    write_json(fs, f"{staging}/{SUCCESS}", manifest)
    old = None
    if fs.exists(final):
        old = f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:12]}"
        fs.mv(final, old, recursive=True)
    fs.mv(staging, final, recursive=True)
    if old is not None:
        fs.rm(old, recursive=True)


def _commit_by_copy(fs: fsspec.AbstractFileSystem, staging: str, final: str, manifest: dict[str, Any]) -> None:
    marker = f"{final}/{SUCCESS}"
    if fs.exists(marker):
        fs.rm(marker)
    new = {p[len(staging) + 1 :] for p in fs.find(staging)}
    old = {p[len(final) + 1 :] for p in fs.find(final)} if fs.exists(final) else set()
    for rel in sorted(new):
        fs.copy(f"{staging}/{rel}", f"{final}/{rel}")
    stale = [f"{final}/{rel}" for rel in sorted(old - new)]
    if stale:
        fs.rm(stale)
    write_json(fs, marker, manifest)
    if new:  # an empty staging "directory" has no objects on a store without directories
        fs.rm([f"{staging}/{rel}" for rel in sorted(new)])
    if fs.exists(staging):  # filesystems that keep directory entries (memory://, some gateways)
        fs.rm(staging, recursive=True)
    fs.invalidate_cache()


def remove_stale_staging(fs: fsspec.AbstractFileSystem, final: str) -> None:
    """Clean up after earlier crashed writers of `final`.

    A committed `<final>.old-*` left by a crash between commit_dir's two renames
    is moved back into place when `final` is missing, so the last good state is
    never deleted; staging leftovers are removed.
    """
    parent, name = final.rstrip("/").rsplit("/", 1)
    if not fs.exists(parent):
        return
    leftovers = []
    for entry in fs.ls(parent, detail=False):
        base = entry.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(f"{name}.old-") and not fs.exists(final) and read_manifest(fs, entry) is not None:
            fs.mv(entry, final, recursive=True)
        elif base.startswith(f"{name}.staging-") or base.startswith(f"{name}.old-"):
            leftovers.append(entry)
    for entry in leftovers:
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
