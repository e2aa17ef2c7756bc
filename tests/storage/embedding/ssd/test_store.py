"""SsdStore: the contract (direct I/O and buffered), persistence and its crashes, tag and a full disk (the row
file's appends, reclaiming and compaction: test_shard_file.py)."""

from __future__ import annotations

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

from storage.embedding.config import StoreConfig
from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import read_snapshot, write_snapshot
from storage.embedding.ssd.store import SsdStore
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

ROOT = Path(__file__).resolve().parents[4]


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


def test_bad_arguments_name_the_value(tmp_path) -> None:
    with pytest.raises(ValueError, match="gc_threshold must be in"):
        SsdStore(str(tmp_path / "s"), DIM, gc_threshold=1.0)
    with pytest.raises(ValueError, match="-2"):
        SsdStore(str(tmp_path / "x"), DIM).reserve(-2)


def test_refuses_object_store_urls() -> None:
    with pytest.raises(ValueError, match="local"):
        SsdStore("s3://bucket/shard", DIM)


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
    from storage.embedding.ssd.store import SsdStore

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
@pytest.mark.subprocess
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
    from storage.embedding.ssd.store import SsdStore
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


@pytest.mark.subprocess
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
