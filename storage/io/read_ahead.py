"""`read_ahead`: an iterator produced by a background thread, a bounded number of items ahead.

Ingest reads and decompresses its next raw chunk while it parses the current one; the trainer's
reader decodes its next batches while a step computes.  Inflating, pyarrow's CSV parsing and
Parquet I/O release the GIL, so the overlap is real.  One implementation for both, at the
lowest layer, so neither package imports the other to get it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _End:
    error: BaseException | None


def read_ahead(
    items: Iterator[T], depth: int, *, name: str = "read-ahead", lazy: bool = False
) -> Generator[T, None, None]:
    """The items of `items`, produced by a background thread at most `depth` items ahead.

    The consumer sees the same items in the same order, then any exception the
    producer raised (with its traceback), at the point where the failed item
    would have come.  Closing the returned generator early (the consumer failed)
    stops the producer and closes `items` in the producer's thread, so files it
    opened are closed before this returns.  `depth` 0 iterates inline.  `name` names the thread.

    By default the producer makes its next item while `depth` wait in the queue, so
    `depth` + 1 items exist besides the one the consumer holds.  With `lazy` it starts an
    item only when fewer than `depth` wait, so at most `depth` exist besides the consumer's
    (the one being made included): for items as large as ingest's chunks, where each one
    more in flight is a chunk more of a task's peak memory.
    """
    if depth <= 0:
        yield from items
        return
    buffer: queue.Queue[Any] = queue.Queue(maxsize=depth)
    slots = threading.Semaphore(depth) if lazy else None  # items made and not yet taken
    stop = threading.Event()

    def wait_for(step: Callable[[], bool]) -> bool:
        while not stop.is_set():
            if step():
                return True
        return False

    def put(item: object) -> bool:
        def step() -> bool:
            try:
                buffer.put(item, timeout=0.05)
                return True
            except queue.Full:
                return False

        return wait_for(step)

    def produce() -> None:
        try:
            source = iter(items)
            while slots is None or wait_for(lambda: slots.acquire(timeout=0.05)):
                try:
                    item = next(source)
                except StopIteration:
                    put(_End(None))
                    return
                if not put(item):
                    return
                del item  # the consumer's now: holding it here would keep it alive past its use
        except BaseException as exc:  # handed to the consumer, raised there
            put(_End(exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            if slots is not None:
                slots.release()
            yield item
            del item  # not held while waiting for the next one
    finally:
        stop.set()
        thread.join()
