"""Raw input files -> chunks of whole lines (I/O only; parsing lives in `pipeline.parse`).

Three pieces, used by `pipeline.ingest`:

- `open_input`: a raw file opened for reading, decompressed on the fly.  Gzip goes through
  python-isal (`isal.igzip`, ISA-L), which inflates about twice as fast as the zlib behind
  the standard `gzip` module: a gzip file cannot be split, so one task inflates it all and
  the inflate rate caps that task.  Other compressions go through fsspec.
- `line_chunks`: chunks of N whole lines from a file object, so every chunk starts at a
  known line number.
- `read_ahead`: runs a chunk iterator in a background thread, `depth` chunks ahead of the
  consumer.  Inflating (ISA-L, zlib, bz2) and pyarrow's CSV parsing and Parquet writing all
  release the GIL, so one task reads the next chunk while it parses and writes the current
  one, instead of doing the three in turn.  Ingest runs it `lazy` with depth 1: the next
  chunk is read only once the consumer has taken the last one, so a task holds two raw
  chunks (the one parsed, the one read) whatever the file size.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

import fsspec
import numpy as np
from fsspec.utils import infer_compression
from isal import igzip
from isal.isal_zlib import IsalError

READ_SIZE = 8 << 20
"""Bytes read from an input per step; a task holds at most this plus one chunk of lines being filled."""
DECOMPRESS_ERRORS: tuple[type[BaseException], ...] = (EOFError, IsalError, OSError, ValueError)
"""What a truncated or corrupt compressed input raises while it is read (zlib/lzma/gzip errors
are OSError or ValueError subclasses, ISA-L's IsalError is neither)."""

T = TypeVar("T")


@contextmanager
def open_input(url: str, storage_options: dict | None = None) -> Iterator[BinaryIO]:
    """`url` opened for binary reading, decompressed per its name (`.gz` with ISA-L, others via fsspec)."""
    compression = infer_compression(url)
    with ExitStack() as stack:
        if compression == "gzip":
            raw = stack.enter_context(fsspec.open(url, "rb", **(storage_options or {})))
            yield stack.enter_context(igzip.IGzipFile(fileobj=raw, mode="rb"))
        else:
            yield stack.enter_context(fsspec.open(url, "rb", compression=compression, **(storage_options or {})))


def line_chunks(
    f: BinaryIO, rows: int, *, budget: int | None = None, read_size: int = READ_SIZE
) -> Iterator[tuple[bytes, int]]:
    """Chunks of up to `rows` whole lines read from file object `f` at its position.

    With `budget`, only the lines starting within the next `budget` bytes are
    read (the last one is completed past the budget): a block's byte range.
    Yields (bytes, line count); the file's last line may lack its newline.
    Blocks are kept as a list and joined once per chunk (no quadratic re-copying).
    """
    parts: list[bytes] = []  # pieces of the chunk being filled, holding `have` newlines
    have = 0
    left = budget
    while True:
        want = read_size if left is None else min(read_size, left)
        block = f.read(want) if want > 0 else b""
        final = not block
        if left is not None:
            left -= len(block)
            if left <= 0:
                final = True
                tail = block or (parts[-1] if parts else b"")
                if tail and not tail.endswith(b"\n"):  # complete the line that started in range
                    block += f.readline()
        if block:
            n = block.count(b"\n")
            if have + n >= rows:
                ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                used = idx = 0  # bytes and newlines of `block` already yielded
                while have + len(ends) - idx >= rows:
                    k = rows - have
                    cut = int(ends[idx + k - 1]) + 1
                    parts.append(block[used:cut])
                    chunk = b"".join(parts)
                    parts.clear()  # before the yield: the pieces would double the chunk while it is out
                    yield chunk, rows
                    del chunk  # hold nothing of a yielded chunk while the next one is read
                    used, idx, have = cut, idx + k, 0
                block = block[used:]
                n = len(ends) - idx
            if block:
                parts.append(block)
                have += n
        if final:
            rest = b"".join(parts)
            parts.clear()
            if rest:
                yield rest, have + (0 if rest.endswith(b"\n") else 1)
            return


@dataclass(frozen=True, slots=True)
class _End:
    error: BaseException | None


def read_ahead(items: Iterator[T], depth: int, *, name: str = "read-ahead", lazy: bool = False) -> Iterator[T]:
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
    buffer: queue.Queue = queue.Queue(maxsize=depth)
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
