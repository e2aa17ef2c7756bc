"""Micro-batching: requests that arrive together are parsed, encoded and scored in one pass.

Each request's entries (raw lines or rows, unparsed) join a queue with the model it started on.
One scoring loop takes the first waiting request, every request already queued behind it (up to
`max_rows` entries), then waits at most `max_wait_s` for more, and hands them to the model's
`score_batch` in its one worker thread.  While a batch is scored, new requests queue up, so under
load the batches grow by themselves and at low load a lone request waits for nobody (with the
default `max_wait_s` of 0).  A request crosses threads once each way (event loop -> scoring
thread -> event loop): parsing happens in the scoring thread with the rest of the batch, so the
feature path's fixed cost is paid once per batch.  Requests of different model versions (during
a switch) are never mixed: a batch holds one model's requests.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from flows.serving.model import StageTimes


@dataclass
class _Item:
    model: Any
    request: Any
    """What the model's `score_batch` takes (a `ScoreRequest`); `len()` is its entry count."""
    done: asyncio.Future = field(repr=False)
    queued: float = 0.0


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    rows: int = 0
    """Entries (lines or rows) of the requests scored."""
    largest: int = 0
    wait_s: float = 0.0
    """Seconds requests waited in the queue (summed over requests)."""
    times: StageTimes = field(default_factory=StageTimes)
    """Seconds per stage of scoring (summed over batches)."""

    def as_dict(self) -> dict[str, Any]:
        mean = self.rows / self.batches if self.batches else 0.0
        return {
            "batches": self.batches,
            "requests": self.requests,
            "rows": self.rows,
            "largest_batch": self.largest,
            "mean_batch_rows": round(mean, 2),
        }


class MicroBatcher:
    """Scores concurrent requests together (see the module docstring).

    Args:
        max_rows: rows above which no more requests join a batch (a bigger request is scored alone).
        max_wait_s: how long a batch waits for more requests once the queue is empty (0: not at all).
    """

    def __init__(self, *, max_rows: int = 4096, max_wait_s: float = 0.0) -> None:
        if max_rows < 1 or max_wait_s < 0:
            raise ValueError(f"max_rows must be >= 1 and max_wait_s >= 0, got {max_rows}, {max_wait_s}")
        self.max_rows, self.max_wait_s = max_rows, max_wait_s
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Item] | None = None
        self._carry: _Item | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="score")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def score(self, model: Any, request: Any) -> Any:
        """`model.score_batch([request, ...])`'s answer for `request`, batched with the others queued."""
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called (it runs inside the server's event loop)")
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Item(model, request, done, time.perf_counter()))
        return await done

    async def _next_batch(self) -> list[_Item]:
        assert self._queue is not None  # noqa: S101 - an invariant, for mypy
        first = self._carry or await self._queue.get()
        self._carry = None
        batch, rows = [first], len(first.request)
        deadline = time.monotonic() + self.max_wait_s
        while rows < self.max_rows:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), left)
                except TimeoutError:
                    break
            if item.model is not first.model or rows + len(item.request) > self.max_rows:
                self._carry = item  # another version, or too big to join: it starts the next batch
                break
            batch.append(item)
            rows += len(item.request)
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.stats
        while True:
            batch = await self._next_batch()
            started = time.perf_counter()
            s.wait_s += sum(started - b.queued for b in batch)
            model = batch[0].model
            try:
                answers = await loop.run_in_executor(
                    self._executor, model.score_batch, [b.request for b in batch], s.times
                )
            except Exception as exc:  # one bad batch fails its own requests, never the loop
                for b in batch:
                    if not b.done.done():
                        b.done.set_exception(exc)
                continue
            for b, answer in zip(batch, answers, strict=True):
                if not b.done.done():
                    b.done.set_result(answer)
            rows = sum(len(b.request) for b in batch)
            s.batches, s.requests, s.rows = s.batches + 1, s.requests + len(batch), s.rows + rows
            s.largest = max(s.largest, rows)
