"""Raw input files -> chunks of whole lines (I/O only; parsing lives in `pipeline.ingest.parse`).

Two pieces, used by `pipeline.ingest.tasks`:

- `open_input`: a raw file opened for reading, decompressed on the fly.  Gzip goes through
  python-isal (`isal.igzip`, ISA-L), which inflates faster than the zlib behind the
  standard `gzip` module: a gzip file cannot be split, so one task inflates it all and
  the inflate rate caps that task.  Other compressions go through fsspec.
- `line_chunks`: chunks of N whole lines from a file object, so every chunk starts at a
  known line number.

Ingest overlaps reading with parsing through `storage.io.read_ahead` (lazy, depth 1: the next
chunk is read only once the parser has taken the last one, so a task holds two raw chunks
whatever the file size).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import BinaryIO, cast

import fsspec
import numpy as np
from fsspec.utils import infer_compression
from isal import igzip
from isal.isal_zlib import IsalError

READ_SIZE = 8 << 20
"""Bytes read from an input per step; a task holds at most this plus one chunk of lines being filled."""
DECOMPRESS_ERRORS: tuple[type[BaseException], ...] = (EOFError, IsalError, OSError, ValueError)  # type: ignore[assignment]  # isal stubs: IsalError an instance
"""What a truncated or corrupt compressed input raises while it is read (zlib/lzma/gzip errors
are OSError or ValueError subclasses, ISA-L's IsalError is neither)."""


@contextmanager
def open_input(url: str, storage_options: dict | None = None) -> Iterator[BinaryIO]:
    """`url` opened for binary reading, decompressed per its name (`.gz` with ISA-L, others via fsspec)."""
    compression = infer_compression(url)
    with ExitStack() as stack:
        if compression == "gzip":
            raw = stack.enter_context(fsspec.open(url, "rb", **(storage_options or {})))
            yield cast(BinaryIO, stack.enter_context(igzip.IGzipFile(fileobj=raw, mode="rb")))
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
