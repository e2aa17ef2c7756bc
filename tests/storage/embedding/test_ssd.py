"""SsdStore: the contract (direct I/O and buffered), persistence and its crashes, the log's
appends and reclaiming, compaction, tag, corruption and a full disk."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from storage.embedding import direct_io
from storage.embedding.config import StoreConfig
from storage.embedding.memory import MemoryStore
from storage.embedding.row_format import RowFormat
from storage.embedding.snapshot import read_snapshot, write_snapshot
from storage.embedding.ssd import SsdStore
from storage.embedding.tiered import open_shard
from tests.helpers.stores import (
    DIM,
    STD,
    all_rows,
    fill_like_reference,
    keys_of,
    same_bytes,
    snapshot_arrays,
)
from tests.storage.embedding.conformance import PersistentStoreContractTests

ROOT = Path(__file__).resolve().parents[3]


class TestSsdStore(PersistentStoreContractTests):
    direct_io = True

    def open(self, path: str, fmt, init_std: float) -> SsdStore:
        return SsdStore(path, fmt, init_std=init_std, direct_io=self.direct_io)

    def path_of(self, store: SsdStore) -> str:
        return str(store.path)


class TestSsdStoreBuffered(TestSsdStore):
    direct_io = False


def test_reopen_after_close_keeps_content(tmp_path) -> None:
    path = str(tmp_path / "s")
    store = SsdStore(path, DIM, init_std=STD)
    ref = fill_like_reference(store, 300)
    store.evict(torch.arange(0, 900, 7))
    ref.evict(torch.arange(0, 900, 7))
    store.close()
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert meta["clean"] is True and meta["rows"] == len(ref)
    assert [p.name for p in (tmp_path / "s").glob("index-*")] == [meta["index"]]
    again = SsdStore(path, DIM, init_std=STD)
    assert len(again) == len(ref)
    got, want = all_rows(again, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    again.close()
    with pytest.raises(ValueError, match="dim"):
        SsdStore(path, DIM + 1)


def test_unclean_shard_is_marked_and_untagged(tmp_path) -> None:
    path = str(tmp_path / "s")
    store = SsdStore(path, DIM, init_std=STD)
    store.update(keys_of(1), torch.ones(1, DIM), lr=0.1)
    store.set_tag("v1")
    assert store.tag == "v1"
    with SsdStore(path, DIM) as reopened:
        assert reopened.tag == "v1"
    store.update(keys_of(2), torch.ones(1, DIM), lr=0.1)  # a change: the tag no longer holds
    assert store.tag is None
    crashed = json.loads((tmp_path / "s" / "meta.json").read_text())  # as a crash would leave it
    assert crashed["clean"] is False and crashed["tag"] is None
    store.flush()
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["clean"] is True
    store.close()


def test_compaction_keeps_content_and_shrinks_file(tmp_path) -> None:
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    keys = torch.arange(4000, dtype=torch.int64) * 13
    store.update(keys, torch.randn(4000, DIM, generator=torch.Generator().manual_seed(5)), lr=0.1)
    store.evict(keys[torch.arange(4000) % 4 != 0])  # keep a quarter
    before = all_rows(store, str(tmp_path / "a.parquet"))
    size = store.file_bytes
    reclaimed = store.compact()
    assert reclaimed > 0 and store.file_bytes == size - reclaimed
    assert store.file_bytes == -(-1000 // store.rows_per_unit) * store.unit_bytes
    assert store.stats()["ssd"]["free_slots"] == 0
    after = all_rows(store, str(tmp_path / "b.parquet"))
    for name in before:
        np.testing.assert_array_equal(before[name], after[name])
    store.update(keys[:8], torch.ones(8, DIM), lr=0.1)  # still writable; survives reopen
    store.close()
    again = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    assert len(again) == 1000 + 6  # keys[0], keys[4] were kept; 6 of the first 8 came back
    again.close()


def test_freed_units_are_reused(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        rpu = store.rows_per_unit
        store.update(torch.arange(4 * rpu), torch.ones(4 * rpu, DIM), lr=0.1)
        store.evict(torch.arange(2 * rpu))  # units 0 and 1 empty: free, the file does not grow
        assert store.stats()["ssd"]["free_units"] == 2
        store.update(torch.arange(1000, 1000 + 2 * rpu), torch.ones(2 * rpu, DIM), lr=0.1)
        st = store.stats()["ssd"]
        assert st["slots"] == 4 * rpu and st["free_units"] == 0 and store.file_bytes == 4 * store.unit_bytes


@pytest.mark.parametrize("threshold", [0.5, 0.25])
def test_random_updates_stay_within_the_space_bound(tmp_path, threshold) -> None:
    """Long random updates, inserts and evictions: the file never exceeds
    unit_bytes * (ceil(L / ceil(t * rows_per_unit)) + 2 + ceil(B / rows_per_unit) + 1)
    (L: live rows, B: rows appended by one call), and the content stays exact."""
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD, gc_threshold=threshold)
    ref = MemoryStore(DIM, init_std=STD)
    rng = np.random.default_rng(3)
    rpu, per_unit = store.rows_per_unit, store._log.gc_rows
    peak_live = 0
    for step in range(300):
        keys = torch.from_numpy(np.unique(rng.integers(0, 3000, 200)))
        grads = torch.from_numpy(rng.standard_normal((keys.numel(), DIM)).astype(np.float32))
        before = store.stats()["ssd"]["gc_rows"]
        store.update(keys, grads, lr=0.05)
        ref.update(keys, grads, lr=0.05)
        if step % 10 == 9:
            gone = torch.from_numpy(np.unique(rng.integers(0, 3000, 100)))
            store.evict(gone)
            ref.evict(gone)
        batch = keys.numel() + store.stats()["ssd"]["gc_rows"] - before
        peak_live = max(peak_live, len(store))
        bound = -(-peak_live // per_unit) + 2 + -(-batch // rpu) + 1
        assert store.file_bytes <= bound * store.unit_bytes, step
    st = store.stats()["ssd"]
    assert st["gc_units"] > 0 and st["bytes_read"] > 0
    amp = store.file_bytes / (len(store) * store.record_bytes)
    assert amp < 1 / threshold + 0.5, amp
    got, want = all_rows(store, str(tmp_path / "a.parquet")), all_rows(ref, str(tmp_path / "b.parquet"))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    store.close()
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD, gc_threshold=threshold) as again:
        got = all_rows(again, str(tmp_path / "c.parquet"))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_bad_arguments_name_the_value(tmp_path) -> None:
    with pytest.raises(ValueError, match="gc_threshold must be in"):
        SsdStore(str(tmp_path / "s"), DIM, gc_threshold=1.0)
    with pytest.raises(ValueError, match="-2"):
        SsdStore(str(tmp_path / "x"), DIM).reserve(-2)


def test_failed_append_changes_no_row(tmp_path, monkeypatch) -> None:
    """A write error (ENOSPC) during an update leaves old rows, new keys and the allocator as they were."""
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    ref = fill_like_reference(store, 200)
    probe = torch.arange(900, dtype=torch.int64)
    before, n, slots = store.lookup(probe).rows.clone(), len(store), store.stats()["ssd"]["slots"]
    real = direct_io.os.pwritev

    def full(fd, bufs, off):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io.os, "pwritev", full)
    keys = torch.arange(0, 900, 2, dtype=torch.int64)  # held rows and new keys
    with pytest.raises(OSError, match="no row changed"):
        store.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)
    assert torch.equal(store.lookup(probe).rows, before) and len(store) == n
    assert store.stats()["ssd"]["slots"] == slots
    monkeypatch.setattr(direct_io.os, "pwritev", real)
    store.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)  # the same update now goes through
    ref.update(keys, torch.ones(keys.numel(), DIM), lr=0.1)
    assert torch.equal(store.lookup(probe).rows, ref.lookup(probe).rows)
    store.close()


def test_corrupt_index_is_detected(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        store.update(keys_of(1, 2), torch.ones(2, DIM), lr=0.1)
        slots = store._map.lookup(np.array([1, 2]))
        store._map.reassign(np.array([1, 2]), slots[::-1].copy())  # the index swaps the two rows
        with pytest.raises(RuntimeError, match="inconsistent"):
            store.lookup(keys_of(1))


def test_refuses_object_store_urls() -> None:
    with pytest.raises(ValueError, match="local"):
        SsdStore("s3://bucket/shard", DIM)


def test_wide_rows_span_several_blocks(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), 400, init_std=STD) as store:  # 4816-byte records: one per 8 KiB unit
        ref = fill_like_reference(store, 40)
        assert torch.equal(store.lookup(torch.arange(120)).rows, ref.lookup(torch.arange(120)).rows)


def test_writes_append_and_read_only_units_they_reclaim(tmp_path) -> None:
    """Log-structured writes: a row update is appended at the tail, never read-modify-written;
    a unit is read only when it falls under the threshold and its live rows move."""
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        rpu, ub = store.rows_per_unit, store.unit_bytes
        thr = store._log.gc_rows

        def write(keys: np.ndarray, seed: int) -> None:
            rows = RowFormat(DIM).fresh(torch.randn(keys.size, DIM, generator=torch.Generator().manual_seed(seed)))
            store.write_rows(keys, rows)
            expect[keys] = rows.emb.numpy()

        expect = np.zeros((4 * rpu, DIM), dtype=np.float32)
        write(np.arange(3 * rpu), 0)  # three full units
        st = store.stats()["ssd"]
        assert st["bytes_read"] == 0 and st["bytes_written"] == 3 * ub
        write(np.array([rpu + 1]), 1)  # one row of a full unit: appended to a new tail unit, no read
        st = store.stats()["ssd"]
        assert st["bytes_read"] == 0 and st["bytes_written"] == 4 * ub and st["slots"] == 3 * rpu + 1
        write(np.array([2, 3]), 2)  # the tail unit is rewritten whole from memory: still no read
        assert store.stats()["ssd"]["bytes_read"] == 0 and store.stats()["ssd"]["slots"] == 3 * rpu + 3
        # Overwrite unit 0 (rows 2, 3 are gone already) until it holds thr - 1 live rows: it is
        # read once and its other rows move with the batch.
        write(np.arange(4, rpu - thr + 3), 3)
        st = store.stats()["ssd"]
        assert st["gc_units"] == 1 and st["gc_rows"] == thr - 1 and st["bytes_read"] == ub
        assert st["free_units"] == 1  # unit 0 is empty and taken first by the next append
        slots = store._map.lookup(np.arange(3 * rpu))
        assert not (slots // rpu == 0).any()
        write(np.arange(3 * rpu, 4 * rpu), 4)
        assert store.stats()["ssd"]["free_units"] == 0
        assert (store._map.lookup(np.arange(3 * rpu, 4 * rpu)) // rpu == 0).any()
        got = store.lookup(torch.arange(4 * rpu)).rows.numpy()
        np.testing.assert_array_equal(got, expect)


# -- crashes: kill -9 at random points ----------------------------------------------------------

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


@pytest.mark.slow
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
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
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
            assert same_bytes(snapshot_arrays(str(p)), snapshot_arrays(str(tmp_path / "ref.parquet"))), (
                f"kill {kill}: {p.name}"
            )
        # Reopen the shard the child left (maybe mid-compaction or with a stale index), restore.
        last = str(done[-1])
        cfg = StoreConfig(embedding_dim=DIM, init_std=STD, host_budget_mb=1, row_dtype="fp32", state_dtype="fp32")
        store = open_shard(str(shard), cfg, optimizer="adam")
        store.restore(last)
        store.snapshot(str(tmp_path / "after.parquet"))
        assert same_bytes(snapshot_arrays(str(tmp_path / "after.parquet")), snapshot_arrays(last))
        store.close()
        start = int(done[-1].stem.split("-")[1])


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
    write_snapshot(str(existing), np.array([5]), RowFormat(DIM).fresh(torch.ones(1, DIM)), RowFormat(DIM))
    limit = 64 * 4096  # the first 200 rows fit (~11 units); 20,000 more do not
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(shard), str(snap_dir / "part-00001.parquet"), str(limit)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=120,
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
    assert read_snapshot(str(existing)).keys.tolist() == [5]
