"""Faults lose nothing: kill -9 at random points, atomic snapshots (local and fsspec memory://),
bad input, non-finite updates and a full disk.

The crash test runs a child process that trains a small HostStore-over-SsdStore stack
(updates, evictions, flushes, compactions, a snapshot every few steps, all
deterministic from a seed) and is SIGKILLed at a random moment.  Afterwards every
committed snapshot must equal, byte for byte, a MemoryStore replay of the same steps,
and a fresh stack opened on the (possibly half-written) shard and restored from the
last snapshot must hold exactly those rows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from storage.embedding.cache import SlotCache
from storage.embedding.config import StoreConfig
from storage.embedding.device_cache import DeviceCache
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.memory import MemoryStore
from storage.embedding.snapshot import SnapshotWriter, read_snapshot, write_snapshot
from storage.embedding.ssd import SsdStore
from storage.embedding.tiered import open_shard
from tests.storage.embedding.conformance import DIM, STD, keys_of

ROOT = Path(__file__).resolve().parents[3]

# The child's workload; `step_ops(j)` is shared with the replay below, so both sides agree.
_WORKLOAD = textwrap.dedent(
    """
    import numpy as np, torch

    DIM, STD, SNAP_EVERY = 8, 0.05, 4

    def step_ops(j):
        gen = torch.Generator().manual_seed(1000 + j)
        keys = torch.randint(0, 400, (64,), generator=gen)
        grads = torch.randn(64, DIM, generator=gen)
        evict = torch.randint(0, 400, (6,), generator=gen) if j % 5 == 4 else None
        return keys, grads, evict
    """
)

_CHILD = _WORKLOAD + textwrap.dedent(
    """
    import sys
    from storage.embedding.host import HostStore, host_row_bytes
    from storage.embedding.ssd import SsdStore

    shard, snaps, j = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ssd = SsdStore(shard, DIM, init_std=STD)
    store = HostStore(DIM, budget_bytes=60 * host_row_bytes(DIM), below=ssd, init_std=STD)
    if j:  # recovery: back to the last snapshot, then carry on from its step
        store.restore(f"{snaps}/snap-{j:05d}.parquet")
    while True:
        keys, grads, evict = step_ops(j)
        store.update(keys, grads, lr=0.05)
        if evict is not None:
            store.evict(evict)
        if j % 3 == 2:
            store.flush()
        if j % 7 == 6:
            store.flush()
            ssd.compact()
        j += 1
        if j % SNAP_EVERY == 0:
            store.snapshot(f"{snaps}/snap-{j:05d}.parquet")
        print(j, flush=True)
    """
)


def _replay(upto: int) -> MemoryStore:
    ns: dict = {}
    exec(_WORKLOAD, ns)  # noqa: S102 - our own constant source
    ref = MemoryStore(DIM, init_std=STD)
    for j in range(upto):
        keys, grads, evict = ns["step_ops"](j)
        ref.update(keys, grads, lr=0.05)
        if evict is not None:
            ref.evict(evict)
    return ref


def _arrays(url: str) -> tuple[np.ndarray, ...]:
    keys, emb, m, v, clock = read_snapshot(url)
    o = np.argsort(keys)
    return keys[o], emb[o], m[o], v[o], clock[o]


def _same_bytes(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> bool:
    return all(x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b, strict=True))


def test_kill_9_at_random_points_restores_last_snapshot_exactly(tmp_path) -> None:
    rng = np.random.default_rng(int(os.environ.get("FAULT_SEED", "0")))
    shard, snaps = tmp_path / "shard", tmp_path / "snaps"
    snaps.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # One child per kill; each opens the shard the previous one left (dirty, maybe mid-compaction),
    # restores the last snapshot and carries on from its step.
    start = 0
    for kill in range(5):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(shard), str(snaps), str(start)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        )
        target = start + int(rng.integers(6, 24))
        step = start
        while step < target:
            line = child.stdout.readline()
            if not line:
                raise AssertionError(f"child died early: {child.stderr.read()[-2000:]}")
            step = int(line)
        time.sleep(float(rng.uniform(0, 0.03)))  # land anywhere inside the next steps
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
        # Every committed snapshot is complete and equals the replay at its step; tmp files
        # of an interrupted snapshot are never taken for snapshots.
        done = sorted(snaps.glob("snap-*.parquet"))
        assert all(re.fullmatch(r"snap-\d{5}\.parquet", p.name) for p in done)
        new = [p for p in done if int(p.stem.split("-")[1]) > start]
        assert new, "the child was killed before its first snapshot"
        for p in new:
            j = int(p.stem.split("-")[1])
            ref = _replay(j)
            ref.snapshot(str(tmp_path / "ref.parquet"))
            assert _same_bytes(_arrays(str(p)), _arrays(str(tmp_path / "ref.parquet"))), f"kill {kill}: {p.name}"
        # Reopen the shard the child left (maybe mid-compaction or with a stale index), restore.
        last = str(done[-1])
        store = open_shard(str(shard), StoreConfig(embedding_dim=DIM, init_std=STD, host_budget_mb=1))
        store.restore(last)
        store.snapshot(str(tmp_path / "after.parquet"))
        assert _same_bytes(_arrays(str(tmp_path / "after.parquet")), _arrays(last))
        store.close()
        start = int(done[-1].stem.split("-")[1])


# -- snapshots: atomic, consistent, through fsspec --------------------------------------------


def _stack(tmp_path, name: str = "s") -> HostStore:
    ssd = SsdStore(str(tmp_path / name), DIM, init_std=STD)
    return HostStore(DIM, budget_bytes=20 * host_row_bytes(DIM), below=ssd, init_std=STD)


def _train(store, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        store.update(torch.randint(0, 100, (32,), generator=gen), torch.randn(32, DIM, generator=gen), lr=0.05)


def test_snapshot_is_a_step_boundary_with_dirty_rows_above(tmp_path) -> None:
    store, ref = _stack(tmp_path), MemoryStore(DIM, init_std=STD)
    _train(store, 7)
    _train(ref, 7)
    assert store.stats()["host"]["dirty"] > 0  # rows newer than the SSD copy exist
    store.snapshot(str(tmp_path / "a.parquet"))
    ref.snapshot(str(tmp_path / "b.parquet"))
    assert _same_bytes(_arrays(str(tmp_path / "a.parquet")), _arrays(str(tmp_path / "b.parquet")))
    store.close()


def test_failed_snapshot_leaves_previous_one_and_no_partial_file(tmp_path, monkeypatch) -> None:
    store = _stack(tmp_path)
    _train(store, 3)
    url = str(tmp_path / "snap" / "part-00000.parquet")
    store.snapshot(url)
    before = _arrays(url)
    _train(store, 3, seed=1)
    calls = {"n": 0}
    real = pq.ParquetWriter.write_table

    def failing(self, table, *a, **k):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(28, "No space left on device")
        return real(self, table, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    monkeypatch.setattr("storage.embedding.snapshot.ROW_GROUP_ROWS", 16)  # several row groups, fail mid-file
    with pytest.raises(OSError, match="No space"):
        store.snapshot(url)
    assert _same_bytes(_arrays(url), before)
    assert sorted(p.name for p in (tmp_path / "snap").iterdir()) == ["part-00000.parquet"]
    store.close()


def test_partial_snapshot_file_is_never_read_as_part(tmp_path) -> None:
    d = tmp_path / "sparse"
    write_snapshot(str(d / "part-00000.parquet"), np.array([1, 2]), np.ones((2, DIM)), np.zeros((2, DIM)),
                   np.zeros((2, DIM)), np.array([1, 1]))
    w = SnapshotWriter(str(d / "part-00001.parquet"), DIM)  # a writer killed before commit
    w.write(np.array([3]), np.ones((1, DIM)), np.zeros((1, DIM)), np.zeros((1, DIM)), np.array([1]))
    w._writer.close()
    w._file.close()
    assert any(".tmp-" in p.name for p in d.iterdir())
    assert read_snapshot(str(d))[0].tolist() == [1, 2]


def test_snapshot_restore_through_fsspec_memory(tmp_path) -> None:
    store = _stack(tmp_path)
    _train(store, 5)
    url = "memory://ctr-test/model/sparse/part-00000.parquet"
    try:
        n = store.snapshot(url)
        fs = fsspec.filesystem("memory")
        assert [p.rsplit("/", 1)[1] for p in fs.ls("/ctr-test/model/sparse", detail=False)] == ["part-00000.parquet"]
        other = _stack(tmp_path, "other")
        assert other.restore("memory://ctr-test/model/sparse", owner=(0, 1)) == n
        store.snapshot(str(tmp_path / "a.parquet"))
        other.snapshot(str(tmp_path / "b.parquet"))
        assert _same_bytes(_arrays(str(tmp_path / "a.parquet")), _arrays(str(tmp_path / "b.parquet")))
        other.close()
    finally:
        fsspec.filesystem("memory").rm("/ctr-test", recursive=True)
    store.close()


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda s: s.lookup(torch.tensor([1, 2], dtype=torch.int32)).rows, TypeError, "int64, got torch.int32"),
        (lambda s: s.update(keys_of(1), torch.ones(1, DIM, dtype=torch.float64), lr=0.1), TypeError, "float64"),
        (lambda s: s.update(keys_of(1, 2), torch.ones(2, DIM + 1), lr=0.1), ValueError, rf"\(2, {DIM + 1}\)"),
        (lambda s: s.update(keys_of(1), torch.ones(1, DIM), lr=-0.5), ValueError, "-0.5"),
        (lambda s: s.lookup(keys_of(-3)).rows, ValueError, "-3"),
    ],
)
def test_bad_input_names_the_value(tmp_path, make, exc, match) -> None:
    store = _stack(tmp_path)
    with pytest.raises(exc, match=match):
        make(store)
    store.close()


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: HostStore(DIM, budget_bytes=-4096), "budget_bytes=-4096"),
        (lambda p: DeviceCache(MemoryStore(DIM), capacity_rows=-5), "-5"),
        (lambda p: SlotCache(-1), "-1"),
        (lambda p: SlotCache(10, evict_extra=-0.1), "-0.1"),
        (lambda p: StoreConfig(host_budget_mb=-1), "-1"),
        (lambda p: StoreConfig(device_cache_rows=-7), "-7"),
        (lambda p: SsdStore(str(p / "x"), DIM).reserve(-2), "-2"),
    ],
)
def test_negative_capacities_are_refused(tmp_path, make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make(tmp_path)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e30])
def test_non_finite_never_reaches_a_stored_row(tmp_path, bad) -> None:
    store = _stack(tmp_path)
    _train(store, 4)  # rows in host (dirty) and on SSD
    snap = str(tmp_path / "before.parquet")
    store.snapshot(snap)
    keys = torch.arange(0, 100, dtype=torch.int64)  # resident, on SSD only, and new keys
    grads = torch.zeros(100, DIM)
    grads[57, 3] = bad
    with pytest.raises(ValueError, match="NaN or inf|non-finite"):
        store.update(keys, grads, lr=0.05)
    store.snapshot(str(tmp_path / "after.parquet"))
    assert _same_bytes(_arrays(snap), _arrays(str(tmp_path / "after.parquet")))
    store.close()


# -- a full disk --------------------------------------------------------------------------------

_FULL_DISK_CHILD = textwrap.dedent(
    """
    import errno, resource, signal, sys
    import numpy as np, torch
    from storage.embedding.ssd import SsdStore
    from storage.embedding.host import HostStore, host_row_bytes
    from storage.embedding.snapshot import read_snapshot

    shard, snap, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ssd = SsdStore(shard, 8, init_std=0.05)
    old = torch.arange(0, 200, dtype=torch.int64)
    ssd.update(old, torch.ones(200, 8), lr=0.1)
    before = ssd.lookup(old).rows.clone()
    ssd.flush()
    # From here on no file may grow past `limit` bytes: writes beyond it fail with EFBIG
    # (SIGXFSZ ignored), as they would with ENOSPC on a full disk.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    new = torch.arange(10_000, 30_000, dtype=torch.int64)
    try:
        ssd.update(new, torch.ones(new.numel(), 8), lr=0.1)
        print("NO-ERROR")
    except OSError as exc:
        assert exc.errno == errno.EFBIG, exc
        print("ERR", exc)
    assert not ssd.contains(new.numpy()).any(), "index points at rows that were never written"
    assert torch.equal(ssd.lookup(old).rows, before), "old rows changed"
    host = HostStore(8, budget_bytes=50 * host_row_bytes(8), below=ssd, init_std=0.05)
    try:
        host.snapshot(snap)
        print("SNAP-OK")
    except OSError as exc:
        print("SNAP-ERR", exc.errno)
    import os
    print("FILES", sorted(os.listdir(os.path.dirname(snap))))
    """
)


def test_full_disk_is_a_clear_error_and_loses_nothing(tmp_path) -> None:
    """Simulated with RLIMIT_FSIZE in a child (EFBIG, like ENOSPC), no root or tmpfs needed."""
    shard, snap_dir = tmp_path / "shard", tmp_path / "snap"
    snap_dir.mkdir()
    existing = snap_dir / "part-00000.parquet"
    write_snapshot(str(existing), np.array([5]), np.ones((1, DIM)), np.zeros((1, DIM)), np.zeros((1, DIM)), [1])
    limit = 64 * 4096  # the first 200 rows fit (~11 units); 20,000 more do not
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(shard), str(snap_dir / "part-00001.parquet"), str(limit)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    err = next(line for line in lines if line.startswith("ERR"))
    assert "rows.bin" in err and "20000 rows" in err and "File too large" in err
    # The snapshot of the (200-row) store fits the limit or fails cleanly; either way no partial file.
    files = eval(next(line for line in lines if line.startswith("FILES"))[6:])  # noqa: S307 - our own output
    assert all(not f.startswith("part-00001") or f == "part-00001.parquet" for f in files)
    assert not any(".tmp-" in f for f in files)
    # Reopening the shard after the failure: exactly the 200 rows written before it.
    ref = MemoryStore(8, init_std=0.05)
    ref.update(torch.arange(0, 200, dtype=torch.int64), torch.ones(200, 8), lr=0.1)
    with SsdStore(str(shard), 8, init_std=0.05) as ssd:
        assert len(ssd) == 200
        probe = torch.arange(0, 400, dtype=torch.int64) * 50  # old keys, failed new keys, unknown keys
        assert torch.equal(ssd.lookup(probe).rows, ref.lookup(probe).rows)
    assert read_snapshot(str(existing))[0].tolist() == [5]
