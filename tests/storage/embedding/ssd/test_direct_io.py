"""UnitFile: whole aligned units with O_DIRECT, coalesced runs, and the buffered fallback (alone and
under an SsdStore)."""

from __future__ import annotations

import errno
import logging
import os
import shutil

import numpy as np
import pytest
import torch

from storage.embedding.ssd import direct_io
from storage.embedding.ssd.direct_io import UnitFile
from storage.embedding.ssd.store import SsdStore
from tests.helpers.stores import DIM, STD, fill_like_reference

UNIT = 4096


def _filled(f: UnitFile, units: np.ndarray, seed: int = 0) -> bytes:
    """Write random bytes to `units` of `f`; returns them."""
    data = np.random.default_rng(seed).integers(0, 256, units.size * UNIT, dtype=np.uint8).tobytes()
    buf = f.buffer(units.size)
    buf[:] = data
    f.write(units, buf)
    return data


def test_units_read_back_as_written_and_past_the_end_as_zeros(tmp_path) -> None:
    f = UnitFile(tmp_path / "f", UNIT, io_threads=1)
    data = _filled(f, np.array([0, 1, 5]))
    assert f.size == 6 * UNIT
    buf = f.buffer(4)
    f.read(np.array([1, 5, 6, 9]), buf)  # 6 and 9 lie past the end of the file
    assert bytes(buf[: 2 * UNIT]) == data[UNIT:]
    assert not any(buf[2 * UNIT :])
    f.close()


def test_contiguous_units_go_in_one_call_per_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(direct_io, "_MAX_RUN_BYTES", 3 * UNIT)  # long runs are split every 3 units
    f = UnitFile(tmp_path / "f", UNIT, io_threads=1)
    assert f._runs(np.array([0, 1, 2, 3, 4, 7, 9, 10])) == [(0, 3), (3, 5), (5, 6), (6, 8)]
    _filled(f, np.array([0, 1, 2, 3, 4, 7, 9, 10]))
    assert f.counters["write_calls"] == 4 and f.counters["bytes_written"] == 8 * UNIT
    f.close()


def test_many_runs_spread_over_the_threads_read_the_same(tmp_path) -> None:
    units = np.arange(0, 80, 2)  # 40 runs of one unit: more than one thread's share
    one, many = UnitFile(tmp_path / "a", UNIT, io_threads=1), UnitFile(tmp_path / "b", UNIT, io_threads=4)
    for f in (one, many):
        _filled(f, units, seed=3)
    a, b = one.buffer(units.size), many.buffer(units.size)
    one.read(units, a)
    many.read(units, b)
    assert bytes(a) == bytes(b) and many.counters["read_calls"] == units.size
    one.close()
    many.close()


def test_a_sibling_replaces_the_file_and_shares_the_counters(tmp_path) -> None:
    f = UnitFile(tmp_path / "f", UNIT, io_threads=1)
    _filled(f, np.arange(4))
    new = f.sibling(tmp_path / "f.new")
    data = _filled(new, np.arange(2), seed=1)
    assert f.counters["bytes_written"] == 6 * UNIT
    f.replace_with(new)
    assert f.size == 2 * UNIT and not (tmp_path / "f.new").exists()
    buf = f.buffer(2)
    f.read(np.arange(2), buf)
    assert bytes(buf) == data
    f.close()
    g = UnitFile(tmp_path / "g", UNIT)
    g.sibling(tmp_path / "g.new").discard()  # an unfinished rewrite leaves nothing behind
    assert not (tmp_path / "g.new").exists()
    g.close()


def test_bad_io_threads_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="io_threads must be >= 1, got 0"):
        UnitFile(tmp_path / "f", UNIT, io_threads=0)


def _fd_flags(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    raise AssertionError("no flags in fdinfo")


def test_o_direct_is_used_on_this_disk(tmp_path) -> None:
    with SsdStore(str(tmp_path / "s"), DIM, init_std=STD) as store:
        assert store.direct_io_active
        assert _fd_flags(store._shard.file.fileno()) & os.O_DIRECT
        assert store.stats()["ssd"]["direct_io"] is True
    with SsdStore(str(tmp_path / "b"), DIM, direct_io=False) as store:
        assert not store.direct_io_active and not _fd_flags(store._shard.file.fileno()) & os.O_DIRECT


def test_falls_back_when_o_direct_is_refused(tmp_path, monkeypatch, caplog) -> None:
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_io.os, "open", refusing_open)
    with caplog.at_level(logging.WARNING, logger="storage.embedding.ssd.direct_io"):
        store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    assert not store.direct_io_active
    assert sum("O_DIRECT refused" in r.getMessage() for r in caplog.records) == 1
    ref = fill_like_reference(store, 200)
    probe = torch.arange(600, dtype=torch.int64)
    assert torch.equal(store.lookup(probe).rows, ref.lookup(probe).rows)
    store.close()


def test_falls_back_when_io_is_refused(tmp_path, monkeypatch, caplog) -> None:
    store = SsdStore(str(tmp_path / "s"), DIM, init_std=STD)
    real = direct_io.os.pwritev
    refused = []

    def pwritev(fd, bufs, off):
        if store.direct_io_active:
            refused.append(off)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, bufs, off)

    monkeypatch.setattr(direct_io.os, "pwritev", pwritev)
    with caplog.at_level(logging.WARNING, logger="storage.embedding.ssd.direct_io"):
        ref = fill_like_reference(store, 100)
    assert refused and not store.direct_io_active
    assert sum("O_DIRECT refused" in r.getMessage() for r in caplog.records) == 1
    assert torch.equal(store.lookup(torch.arange(300)).rows, ref.lookup(torch.arange(300)).rows)
    store.close()


def test_shm_works_direct_or_buffered(tmp_path) -> None:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    path = os.path.join(base, f"ctrpipe-test-{os.getpid()}")
    try:
        with SsdStore(path, DIM, init_std=STD) as store:  # tmpfs: O_DIRECT on newer kernels, else fallback
            ref = fill_like_reference(store, 50)
            assert torch.equal(store.lookup(torch.arange(150)).rows, ref.lookup(torch.arange(150)).rows)
    finally:
        shutil.rmtree(path, ignore_errors=True)
