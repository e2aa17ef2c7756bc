"""UnitLog: appends fill the tail, then free units lowest first, then new units; sparse units are
reclaimed; a failed write rolls the allocator back."""

from __future__ import annotations

import numpy as np

from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.disk_format import record_dtype
from storage.embedding.ssd.unit_log import UnitLog

RPU = 4  # rows per unit


def _log(gc_rows: int = 2) -> UnitLog:
    return UnitLog(RPU, gc_rows, record_dtype(RowFormat(2)))


def _append(log: UnitLog, n: int) -> np.ndarray:
    old_tail = log.tail_unit
    slots = log.allocate(n)
    log.wrote(slots, np.zeros(n, dtype=record_dtype(RowFormat(2))), old_tail)
    return slots


def test_appends_fill_the_tail_then_free_units_then_new_ones() -> None:
    log = _log()
    assert _append(log, 6).tolist() == [0, 1, 2, 3, 4, 5]  # unit 0 full, unit 1 is the tail
    assert log.tail_unit == 1 and log.live.tolist()[:2] == [4, 2]
    log.release(np.array([0, 1, 2, 3]), np.empty(0, dtype=np.int64))  # unit 0 dies: free
    assert log.free_units.tolist() == [0]
    assert _append(log, 7).tolist() == [6, 7, 0, 1, 2, 3, 8]  # rest of the tail, unit 0, then unit 2
    assert log.tail_unit == 2 and log.free_units.size == 0


def test_units_left_sparse_are_victims_and_the_tail_never_is() -> None:
    log = _log(gc_rows=2)
    _append(log, 10)  # units 0, 1 full; unit 2 (the tail) holds 2
    victims, idle = log.victims(np.array([0, 1, 2]))  # unit 0 would keep one row: under 2
    assert victims.tolist() == [0] and idle.size == 0
    victims, _ = log.victims(np.array([8]))  # the tail unit drops to one row: still not a victim
    assert victims.size == 0


def test_rollback_undoes_an_allocation() -> None:
    log = _log()
    _append(log, 5)
    before = log.state()
    log.allocate(9)
    log.rollback(before)
    assert _append(log, 3).tolist() == [5, 6, 7]  # as if the failed append never happened


def test_reset_after_reopen_frees_empty_units_and_rechecks_sparse_ones() -> None:
    log = _log(gc_rows=2)
    log.recount(12, [np.array([0, 1, 2, 3, 9])])  # unit 0 full, unit 1 empty, unit 2 one row
    assert log.free_units.tolist() == [1] and log.tail_unit == -1
    victims, _ = log.victims(np.empty(0, dtype=np.int64))
    assert victims.tolist() == [2]
    log.packed(6)
    assert log.live.tolist() == [4, 2] and log.free_units.size == 0
