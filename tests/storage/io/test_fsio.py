"""Atomic directory commits: readers see the old or the new output, never a mix, and a crash loses nothing.

Local filesystems commit by rename.  Object stores (a real moto S3 server, and memory://) commit by one
PUT of `_SUCCESS.json` naming a fresh data prefix: the crash tests stop a writer before each of its
storage operations in turn and read back what a reader would see.
"""

from __future__ import annotations

import importlib.util

import fsspec
import pytest

from storage.io import fsio
from tests.helpers.procs import AWS_ENV, moto_s3

A = {"a": b"old a", "b": b"old b", "nested/c": b"old c"}
B = {"a": b"new a", "nested/d": b"new d"}


class Killed(BaseException):
    """The writer process dies here (BaseException: no `except Exception` cleanup runs)."""


def _stage(fs, final, files):
    staging = fsio.staging_dir(fs, final)
    for name, data in files.items():
        fs.pipe(f"{staging}/{name}", data)
    return staging


def read_back(fs, final) -> tuple[dict, dict[str, bytes]] | None:
    """What a fresh reader sees: (manifest without the data key, rel path -> bytes), or None when not committed."""
    fs.invalidate_cache()
    manifest = fsio.read_manifest(fs, final)
    if manifest is None:
        return None
    base = fsio.data_dir(final, manifest)
    files = {rel: fs.cat(f"{base}/{rel}") for rel in fsio.data_files(fs, final, manifest)}
    return {k: v for k, v in manifest.items() if k != fsio.DATA}, files


def listing(fs, path) -> list[str]:
    fs.invalidate_cache()
    return sorted(p[len(path) + 1 :] for p in fs.find(path))


@pytest.fixture(scope="module")
def s3_options(tmp_path_factory):
    missing = [m for m in ("s3fs", "moto") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"S3 tests need {' and '.join(missing)}: pip install 's3fs>=2024.6' 'moto[server]>=5'")
    with pytest.MonkeyPatch.context() as mp:
        for k, v in AWS_ENV.items():
            mp.setenv(k, v)
        with moto_s3(tmp_path_factory.mktemp("moto")) as options:
            yield options


def _fs_root(kind, request, tmp_path):
    if kind == "file":
        return fsspec.filesystem("file"), str(tmp_path)
    if kind == "memory":
        fs = fsspec.filesystem("memory")
        root = f"/commit-{tmp_path.name}"
        fs.makedirs(root, exist_ok=True)
        return fs, root
    import s3fs

    return s3fs.S3FileSystem(**request.getfixturevalue("s3_options")), f"ctr/{tmp_path.name}"


@pytest.fixture(params=["file", "memory", pytest.param("s3", marks=pytest.mark.server)])  # s3: a moto server
def fs_root(request, tmp_path):
    return _fs_root(request.param, request, tmp_path)


@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.server)])
def store_root(request, tmp_path):
    """Object stores only: the data-prefix commit."""
    return _fs_root(request.param, request, tmp_path)


def test_commit_replaces_the_old_output_and_writes_the_manifest(fs_root):
    fs, root = fs_root
    final = f"{root}/out"
    fsio.commit_dir(fs, _stage(fs, final, {"a": b"1", "b": b"2"}), final, {"run": 1})
    fsio.commit_dir(fs, _stage(fs, final, {"a": b"3"}), final, {"run": 2})
    assert read_back(fs, final) == ({"run": 2}, {"a": b"3"})  # files of the old output do not linger
    assert sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)) == ["out"]
    manifest = fsio.read_manifest(fs, final)
    if isinstance(fs, fsspec.implementations.local.LocalFileSystem):  # local layout unchanged: data at final
        assert manifest == {"run": 2} and fs.cat(f"{final}/a") == b"3"
    else:
        data = manifest["data"]
        assert listing(fs, final) == sorted(["_SUCCESS.json", f"{data}/_SUCCESS.json", f"{data}/a"])


def _writer_b(fs, final, op):
    stage = fsio.staging_dir(fs, final)
    for name, data in B.items():
        op(f"put {name}")
        fs.pipe(f"{stage}/{name}", data)
    fsio.commit_dir(fs, stage, final, {"run": "B"})


def _crashing(monkeypatch, fs, kill_at: int | None):
    """Count the writer's storage writes and deletes in a log; raise Killed before write number `kill_at`."""
    log: list[str] = []

    def op(what: str) -> None:
        if len(log) == kill_at:
            raise Killed(what)
        log.append(what)

    write_json, rm = fsio.write_json, fs.rm

    def counted_write_json(fs_, path, obj):
        op(f"write {path}")
        write_json(fs_, path, obj)

    def counted_rm(path, *args, **kwargs):
        op(f"rm {path}")
        rm(path, *args, **kwargs)

    monkeypatch.setattr(fsio, "write_json", counted_write_json)
    monkeypatch.setattr(fs, "rm", counted_rm)
    return log, op


def test_a_writer_killed_before_the_manifest_put_leaves_the_old_output_and_after_it_the_new(store_root, monkeypatch):
    fs, root = store_root

    def commit_a(final):
        fsio.commit_dir(fs, _stage(fs, final, A), final, {"run": "A"})

    want_a, want_b = ({"run": "A"}, A), ({"run": "B"}, B)

    # an uninterrupted writer: the list of its operations and where the commit point is
    commit_a(f"{root}/dry")
    with monkeypatch.context() as m:
        log, op = _crashing(m, fs, None)
        _writer_b(fs, f"{root}/dry", op)
    put = log.index(f"write {root}/dry/_SUCCESS.json")
    assert log[put - 1].endswith("/_SUCCESS.json") and "/v-" in log[put - 1]  # the prefix's own copy first
    assert put == len(B) + 1 and len(log) > put + 1  # then the delete of the previous prefix
    assert read_back(fs, f"{root}/dry") == want_b

    for kill_at in range(len(log)):
        final = f"{root}/out{kill_at}"
        commit_a(final)
        with monkeypatch.context() as m:
            _, op = _crashing(m, fs, kill_at)
            with pytest.raises(Killed):
                _writer_b(fs, final, op)
        assert read_back(fs, final) == (want_a if kill_at <= put else want_b), (kill_at, log[kill_at])
        # the next writer removes what the killed one left, and only that
        fsio.remove_stale_staging(fs, final)
        manifest = fsio.read_manifest(fs, final)
        live = (
            [f"{manifest['data']}/{rel}" for rel in fsio.data_files(fs, final, manifest)]
            if "data" in manifest
            else list(fsio.data_files(fs, final, manifest))
        )
        inner = [f"{manifest['data']}/_SUCCESS.json"] if "data" in manifest else []
        assert listing(fs, final) == sorted(["_SUCCESS.json", *inner, *live]), kill_at
        assert read_back(fs, final) == (want_a if kill_at <= put else want_b)
        _writer_b(fs, final, lambda what: None)  # and a rerun completes it
        assert read_back(fs, final) == want_b


def test_staged_cleans_up_crashed_writers_and_keeps_the_committed_prefix(store_root):
    fs, root = store_root
    final = f"{root}/out"
    fsio.commit_dir(fs, _stage(fs, final, A), final, {"run": "A"})
    crashed = _stage(fs, final, {"a": b"half"})  # a writer killed before its commit
    assert crashed.startswith(f"{final}/v-")
    with fsio.staged(fs, final) as stage:
        assert not fs.exists(crashed) and read_back(fs, final) == ({"run": "A"}, A)
        fs.pipe(f"{stage}/a", b"C")
        fsio.commit_dir(fs, stage, final, {"run": "C"})
    assert read_back(fs, final) == ({"run": "C"}, {"a": b"C"})
    with pytest.raises(RuntimeError), fsio.staged(fs, final) as stage:  # a failing writer removes its own prefix
        fs.pipe(f"{stage}/a", b"D")
        raise RuntimeError("boom")
    data = fsio.read_manifest(fs, final)["data"]
    assert listing(fs, final) == sorted(["_SUCCESS.json", f"{data}/_SUCCESS.json", f"{data}/a"])


def test_data_url_resolves_once_and_a_running_writer_is_never_read(store_root):
    fs, root = store_root
    final = f"{root}/out"
    url = fs.unstrip_protocol(final)
    so = getattr(fs, "storage_options", None)
    assert fsio.data_url(url, so) == url  # not committed: unchanged, the caller reports it
    fsio.commit_dir(fs, _stage(fs, final, A), final, {"run": "A"})
    first = fsio.data_url(url, so)
    running = _stage(fs, final, {"a": b"half"})  # a writer still running beside the committed prefix
    assert fsio.data_url(url, so) == first and read_back(fs, final) == ({"run": "A"}, A)
    fsio.commit_dir(fs, _stage(fs, final, B), final, {"run": "B"})
    data = fsio.data_url(url, so)
    assert (
        data.startswith(f"{url}/v-") and data != first and fsio.data_url(data, so) == data
    )  # committed in its own right
    assert fsio.read_manifest(*fsio.get_fs(data, so)) == {"run": "B"}
    assert not fs.exists(fsio.get_fs(first, so)[1])  # the superseded prefix is gone
    assert fs.exists(running)  # another writer's prefix is not the commit's to delete


def test_commit_rejects_a_foreign_staging_path_and_the_reserved_key(store_root):
    fs, root = store_root
    final = f"{root}/out"
    with pytest.raises(ValueError, match="not a data prefix"):
        fsio.commit_dir(fs, f"{root}/elsewhere", final, {"run": 1})
    with pytest.raises(ValueError, match="reserved"):
        fsio.commit_dir(fs, _stage(fs, final, A), final, {"data": "mine"})
    with pytest.raises(ValueError, match="data prefix"):
        fsio.data_dir(final, {"data": "../other"})


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


def test_a_small_file_is_replaced_whole_and_leaves_no_temporary_behind(fs_root):
    fs, root = fs_root
    path = f"{root}/LATEST"
    fsio.write_text_atomic(fs, path, "v00001\n")
    fsio.write_text_atomic(fs, path, "v00002\n")
    assert fs.cat(path) == b"v00002\n"
    assert listing(fs, root) == ["LATEST"]  # on an object store one PUT: no temporary object to leave behind
