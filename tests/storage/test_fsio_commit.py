"""Atomic directory commits: readers see the old or the new output, never a mix, and a crash loses nothing."""

from __future__ import annotations

import fsspec
import pytest

from storage import fsio


def _stage(fs, final, files):
    staging = fsio.staging_dir(fs, final)
    for name, data in files.items():
        fs.pipe(f"{staging}/{name}", data)
    return staging


@pytest.fixture(params=["file", "memory"])
def fs_root(request, tmp_path):
    if request.param == "file":
        return fsspec.filesystem("file"), str(tmp_path)
    fs = fsspec.filesystem("memory")
    root = f"/commit-{tmp_path.name}"
    fs.makedirs(root, exist_ok=True)
    return fs, root


def test_commit_replaces_the_old_output_and_writes_the_manifest(fs_root):
    fs, root = fs_root
    final = f"{root}/out"
    fsio.commit_dir(fs, _stage(fs, final, {"a": b"1", "b": b"2"}), final, {"run": 1})
    fsio.commit_dir(fs, _stage(fs, final, {"a": b"3"}), final, {"run": 2})
    assert fsio.read_manifest(fs, final) == {"run": 2}
    assert fs.cat(f"{final}/a") == b"3"
    assert not fs.exists(f"{final}/b")  # files of the old output do not linger
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)) == ["out"]


def test_a_crash_between_the_two_renames_is_recovered_by_the_next_writer(tmp_path):
    fs = fsspec.filesystem("file")
    final = str(tmp_path / "out")
    fsio.commit_dir(fs, _stage(fs, final, {"a": b"good"}), final, {"run": 1})
    fs.mv(final, f"{final}.old-deadbeef0000", recursive=True)  # the crash: moved aside, new one never renamed
    fs.makedirs(f"{final}.staging-cafe00000000", exist_ok=True)
    assert fsio.read_manifest(fs, final) is None
    fsio.remove_stale_staging(fs, final)
    assert fsio.read_manifest(fs, final) == {"run": 1} and fs.cat(f"{final}/a") == b"good"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_uncommitted_staging_is_removed_and_committed_output_kept(tmp_path):
    fs = fsspec.filesystem("file")
    final = str(tmp_path / "out")
    fsio.commit_dir(fs, _stage(fs, final, {"a": b"1"}), final, {"run": 1})
    _stage(fs, final, {"a": b"half"})  # a writer that died before committing
    fsio.remove_stale_staging(fs, final)
    assert fs.cat(f"{final}/a") == b"1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
