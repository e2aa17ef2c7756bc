"""Committing a stage's output directory on any filesystem, manifest last.

`storage.fsio.commit_dir` renames the staging directory into place, which is
atomic on a local filesystem.  On an object store a "rename" of a directory
is a copy of each object in no guaranteed order, so the manifest could be
copied before the data it describes.  `commit_output` therefore, off local
disks, (1) removes the old manifest (readers stop trusting the old
directory), (2) copies the staged files over, (3) deletes files of the old
output that the new one does not have, (4) writes `_SUCCESS.json` last and
(5) removes the staging prefix.  A reader sees either no manifest or a
complete directory with its manifest, never a mix; a crash before (4) leaves
an uncommitted directory that the next run rewrites.  Unlike the local case
the previous output is not readable during the commit window.
"""

from __future__ import annotations

from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from storage.fsio import SUCCESS, commit_dir, write_json


def commit_output(fs: fsspec.AbstractFileSystem, staging: str, final: str, manifest: dict[str, Any]) -> None:
    """Make the files under `staging` the committed content of `final`, `_SUCCESS.json` written last."""
    if isinstance(fs, LocalFileSystem):
        commit_dir(fs, staging, final, manifest)
        return
    staging, final = staging.rstrip("/"), final.rstrip("/")
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
    fs.invalidate_cache()
