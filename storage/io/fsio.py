"""Filesystem helpers shared by every stage: fsspec URLs, atomic commits, manifests.

Every writer in the project writes into a staging location and commits last,
so a crash at any point leaves the previous committed state readable:

- a directory output on a local filesystem is written under
  `<final>.staging-<token>/` and renamed into place, its `_SUCCESS.json`
  manifest written last;
- a directory output on an object store (s3://, gs://, memory://, ...) is
  written under a fresh data prefix `<final>/v-<token>/`; the single PUT of
  `<final>/_SUCCESS.json` naming that prefix (`"data": "v-<token>"`) is the
  commit, and the previous prefix is deleted after it (no copy of the data);
- a single small file (a pointer such as `LATEST`) is written beside its
  target and renamed over it (on an object store: one PUT).

Readers trust a directory only when its `_SUCCESS.json` exists, and find its
files at `data_dir(final, manifest)` (or `data_url(url)`): `final` itself on a
local filesystem, the named data prefix on an object store.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

SUCCESS = "_SUCCESS.json"
DATA = "data"
"""Manifest key naming the data prefix of a directory committed on an object store (absent: `final` itself)."""
_DATA_PREFIX = re.compile(r"^v-[0-9a-f]{12}$")


def get_fs(url: str, storage_options: dict[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
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


def _versioned(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether directories on `fs` commit through data prefixes (no atomic rename: any non-local fs)."""
    return not isinstance(fs, LocalFileSystem)


def staging_dir(fs: fsspec.AbstractFileSystem, final: str) -> str:
    """A fresh location to write the next content of `final` into, before `commit_dir`.

    Local filesystem: `<final>.staging-<token>` beside it (the commit is a rename).
    Object store: the data prefix `<final>/v-<token>` inside it, where the
    files stay after the commit (an object-store rename is a slow copy).
    """
    token = uuid.uuid4().hex[:12]
    final = final.rstrip("/")
    path = f"{final}/v-{token}" if _versioned(fs) else f"{final}.staging-{token}"
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
    """Make the files under `staging` (from `staging_dir`) the committed content of `final`, `_SUCCESS.json` last.

    Local filesystem: the manifest is written into the staging directory, the
    previous `final` is moved aside, the staging directory renamed into place
    and the old one removed.  A crash between the two renames leaves `final`
    missing and `<final>.old-*` complete; `remove_stale_staging` (which every
    writer calls first) moves it back.

    Object stores: a directory "rename" is a copy of each object in no fixed
    order, so nothing is moved.  `staging` is the data prefix `<final>/v-<token>`:
    (1) a copy of the manifest is written into it (so its URL, as `data_url`
    returns it, is itself a committed directory), (2) `<final>/_SUCCESS.json`
    is replaced with the manifest plus `"data": "v-<token>"`: this one PUT is
    the commit, (3) the previous data prefix is deleted.  Until (2) readers see the
    previous output, complete; after it the new one.  A crash after (2) leaves
    the old files beside the new ones, unreferenced, for the next writer to remove.

    Raises:
        ValueError: on an object store, `staging` is not a data prefix of `final`,
            or `manifest` already has the reserved key `"data"`.
    """
    if not _versioned(fs):
        write_json(fs, f"{staging}/{SUCCESS}", manifest)
        old = None
        if fs.exists(final):
            old = f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:12]}"
            fs.mv(final, old, recursive=True)
        fs.mv(staging, final, recursive=True)
        if old is not None:
            fs.rm(old, recursive=True)
        return
    final, staging = final.rstrip("/"), staging.rstrip("/")
    parent, name = staging.rsplit("/", 1)
    if parent != final or not _DATA_PREFIX.match(name):
        raise ValueError(f"{staging} is not a data prefix of {final}: get it from fsio.staging_dir or fsio.staged")
    if DATA in manifest:
        raise ValueError(f"manifest key {DATA!r} is reserved for the data prefix; rename it (manifest of {final})")
    write_json(fs, f"{staging}/{SUCCESS}", manifest)
    previous = read_manifest(fs, final)
    write_json(fs, f"{final}/{SUCCESS}", {**manifest, DATA: name})  # the commit point
    superseded = previous.get(DATA) if previous else None
    fs.invalidate_cache(final)
    # another v- prefix may belong to a writer still running: crashed ones go in remove_stale_staging
    if superseded and superseded != name and fs.exists(f"{final}/{superseded}"):
        fs.rm(f"{final}/{superseded}", recursive=True)
    fs.invalidate_cache()


def data_dir(final: str, manifest: Mapping[str, Any]) -> str:
    """Where the files of committed directory `final` are, given its manifest (from `read_manifest`).

    `<final>/<manifest["data"]>` for a directory committed on an object store,
    else `final` itself (a local filesystem).  Works on URLs and protocol-less paths alike.

    Raises:
        ValueError: `manifest["data"]` is not a data prefix name (`v-` + 12 hex digits).
    """
    name = manifest.get(DATA)
    if name is None:
        return final.rstrip("/")
    if not isinstance(name, str) or not _DATA_PREFIX.match(name):
        raise ValueError(f"manifest of {final} names data prefix {name!r}; expected 'v-' and 12 hex digits")
    return join(final, name)


def data_url(url: str, storage_options: dict[str, Any] | None = None) -> str:
    """The URL of the files of directory `url`: `data_dir` when it is committed, else `url` itself.

    The result of a committed directory is again a committed directory (it holds
    a copy of the manifest, without `"data"`), so `data_url(data_url(u)) == data_url(u)`
    and code that checks for a manifest accepts it.  An uncommitted `url` comes
    back unchanged, so the caller's own check reports it.
    """
    fs, path = get_fs(url, storage_options)
    manifest = read_manifest(fs, path)
    return url.rstrip("/") if manifest is None else data_dir(url, manifest)


def committed_data_url(url: str, fs: fsspec.AbstractFileSystem, staging: str) -> str:
    """`data_url(url)` right after `commit_dir(fs, staging, <url's path>, ...)`, without reading the manifest.

    The writer knows where its files went: the staging prefix on an object store, `url` itself locally.
    """
    return join(url, staging.rstrip("/").rsplit("/", 1)[-1]) if _versioned(fs) else url.rstrip("/")


def data_files(fs: fsspec.AbstractFileSystem, final: str, manifest: Mapping[str, Any]) -> list[str]:
    """Paths relative to `data_dir(final, manifest)` of every file of committed `final` but its manifest, sorted."""
    base = data_dir(final, manifest)
    rels = (entry[len(base.rstrip("/")) :].lstrip("/") for entry in fs.find(base))
    return sorted(rel for rel in rels if rel != SUCCESS)


def remove_stale_staging(fs: fsspec.AbstractFileSystem, final: str) -> None:
    """Clean up after earlier crashed writers of `final`.

    A committed `<final>.old-*` left by a crash between commit_dir's two renames
    is moved back into place when `final` is missing, so the last good state is
    never deleted; staging leftovers are removed.  On an object store the data
    prefixes `<final>/v-*` that `<final>/_SUCCESS.json` does not name are
    removed too (writers killed before their commit, or after it and before
    deleting the previous prefix).
    """
    final = final.rstrip("/")
    parent, name = final.rsplit("/", 1)
    if not fs.exists(parent):
        return
    if _versioned(fs):
        fs.invalidate_cache(parent)
    leftovers = []
    for entry in fs.ls(parent, detail=False):
        base = entry.rstrip("/").rsplit("/", 1)[-1]
        if base.startswith(f"{name}.old-") and not fs.exists(final) and read_manifest(fs, entry) is not None:
            fs.mv(entry, final, recursive=True)
        elif base.startswith(f"{name}.staging-") or base.startswith(f"{name}.old-"):
            leftovers.append(entry)
    if _versioned(fs) and fs.isdir(final):
        manifest = read_manifest(fs, final)
        live = manifest.get(DATA) if manifest else None
        for entry in fs.ls(final, detail=False):
            base = entry.rstrip("/").rsplit("/", 1)[-1]
            if base != live and _DATA_PREFIX.match(base):
                leftovers.append(entry)
    for entry in leftovers:
        fs.rm(entry, recursive=True)
    if leftovers and _versioned(fs):
        fs.invalidate_cache()


def read_manifest(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, Any] | None:
    """The committed manifest of directory `path`, or None when it is not committed."""
    target = f"{path.rstrip('/')}/{SUCCESS}"
    if not fs.exists(target):
        return None
    manifest: dict[str, Any] = read_json(fs, target)
    return manifest


def write_json(fs: fsspec.AbstractFileSystem, path: str, obj: Any) -> None:
    with fs.open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)


def read_json(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    with fs.open(path, "r") as f:
        return json.load(f)


def write_text_atomic(fs: fsspec.AbstractFileSystem, path: str, text: str) -> None:
    """Replace the file at `path` so readers see the old or the new text, never a partial one.

    Locally a temporary file renamed over it; on an object store one PUT, which replaces an object
    atomically (a temporary object and a move would leave the temporary behind when killed between).
    """
    if not isinstance(fs, LocalFileSystem):
        with fs.open(path, "w") as f:
            f.write(text)
        return
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:12]}"
    with fs.open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # atomic on POSIX
