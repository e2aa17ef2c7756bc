"""Concurrent requests are scored in shared forward passes, each gets its own scores, versions never mix."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from flows.serving.batcher import MicroBatcher


class _Model:
    """Scores an entry as its value times `factor`; records the entries per batch it was called with."""

    def __init__(self, factor: float, gate: threading.Event | None = None) -> None:
        self.factor, self.calls, self.gate = factor, [], gate
        self.threads: set[int] = set()

    def score_batch(self, requests: list[list[float]], times) -> list[np.ndarray]:
        if self.gate is not None:
            self.gate.wait(5)  # hold the first batch so that the next requests queue up behind it
        self.threads.add(threading.get_ident())
        self.calls.append(sum(len(r) for r in requests))
        return [np.asarray(r, np.float64) * self.factor for r in requests]


def test_requests_queued_behind_a_batch_are_scored_together_and_get_their_own_scores():
    gate = threading.Event()
    a, b = _Model(1.0, gate), _Model(-1.0)

    async def main():
        batcher = MicroBatcher(max_rows=100)
        batcher.start()
        first = asyncio.ensure_future(batcher.score(a, [0.0]))
        await asyncio.sleep(0.05)  # the first batch is being scored (held by the gate)
        later = [asyncio.ensure_future(batcher.score(a, [i, i + 0.5])) for i in range(1, 11)]
        other = asyncio.ensure_future(batcher.score(b, [7.0]))
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(first, *later, other)
        await batcher.stop()
        return out, batcher.stats

    out, stats = asyncio.run(main())
    assert out[0].tolist() == [0.0]
    assert [o.tolist() for o in out[1:11]] == [[i, i + 0.5] for i in range(1, 11)]
    assert out[11].tolist() == [-7.0]  # another version's request: its own batch, its own model
    assert a.calls == [1, 20] and b.calls == [1]  # ten requests in one forward pass
    assert stats.requests == 12 and stats.batches == 3 and stats.largest == 20
    assert (
        len(a.threads | b.threads) == 1 and threading.get_ident() not in a.threads
    )  # one scoring thread, not the loop
    assert stats.wait_s > 0  # the requests held behind the gate waited in the queue


def test_a_batch_stops_growing_at_max_rows():
    gate = threading.Event()
    model = _Model(2.0, gate)

    async def main():
        batcher = MicroBatcher(max_rows=4)
        batcher.start()
        head = asyncio.ensure_future(batcher.score(model, [1.0]))
        await asyncio.sleep(0.05)
        rest = [asyncio.ensure_future(batcher.score(model, [1.0, 2.0])) for _ in range(3)]
        await asyncio.sleep(0.05)
        gate.set()
        out = await asyncio.gather(head, *rest)
        await batcher.stop()
        return out

    out = asyncio.run(main())
    assert [o.tolist() for o in out[1:]] == [[2.0, 4.0]] * 3
    assert model.calls == [1, 4, 2]
