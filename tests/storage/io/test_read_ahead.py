"""The read-ahead thread: same items in order, the producer's error in place, bounded memory, a clean stop."""

from __future__ import annotations

import threading
import time

import pytest

from storage.io.read_ahead import read_ahead


def test_read_ahead_yields_the_same_items_in_order():
    items = [bytes([i]) * 10 for i in range(50)]
    for depth in (0, 1, 3):
        assert list(read_ahead(iter(items), depth)) == items


def test_read_ahead_raises_the_producers_error_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise EOFError("truncated")

    items = read_ahead(source(), 1)
    assert (next(items), next(items)) == (1, 2)
    with pytest.raises(EOFError, match="truncated"):
        next(items)


def test_a_consumer_that_stops_early_stops_the_producer_and_closes_its_source():
    closed = threading.Event()
    produced = []

    def source():
        try:
            for i in range(1000):
                produced.append(i)
                yield i
        finally:
            closed.set()  # where a reader's `with open(...)` would close its file

    reader = read_ahead(source(), 2)
    assert next(reader) == 0
    reader.close()  # what a failed parse does to the task's chunk iterator
    assert closed.is_set()  # set before close() returned: the thread is done
    assert len(produced) <= 5  # it never ran ahead more than `depth` (+ the ones in hand)
    assert not [t for t in threading.enumerate() if t.name == "read-ahead"]


@pytest.mark.parametrize("lazy", [False, True])
def test_read_ahead_bounds_the_items_made_and_not_yet_taken(lazy):
    made = []

    def source():
        for i in range(20):
            made.append(i)  # runs when the producer starts item i
            yield i

    depth = 2
    reader = read_ahead(source(), depth, lazy=lazy)
    for taken, item in enumerate(reader, start=1):
        assert item == taken - 1
        time.sleep(0.01)  # give the producer time to run as far ahead as it may
        # lazy: the one being made counts (ingest's chunks); otherwise one more is made while `depth` wait
        assert len(made) - taken <= (depth if lazy else depth + 1)
    assert made == list(range(20))
