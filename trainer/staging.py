"""A batch's dense features and labels on the training device before the step that uses them.

On CUDA the reader thread (`trainer.data.Prefetcher`, on by default there) calls `BatchStager`
on each batch it prepares: the arrays are copied into pinned memory and sent to the GPU with
`non_blocking` on a side stream, while the current step computes on the default stream; the
step's `staged_inputs` makes the default stream wait for that copy (an event, no host wait).
The keys stay on the host: routing and the stores' key indexes work there.  On CPU nothing moves.
"""

from __future__ import annotations

import dataclasses

import torch

from storage.embedding.rows.transfer import host_to_device
from trainer.data import Batch


class BatchStager:
    """Copies each batch's dense features and labels to `device` ahead of its step (a no-op off CUDA).

    Args:
        device: the rank's training device.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __call__(self, batch: Batch) -> Batch:
        """`batch` with dense and labels on the device (runs in the reader thread)."""
        if self._stream is None:
            return batch
        # the reader thread's current device is cuda:0 until set: pinning there would open a CUDA context
        # on GPU 0 for every rank of the node
        with torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            labels = host_to_device(batch.labels, self.device)
            dense = host_to_device(batch.dense, self.device)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return dataclasses.replace(batch, labels=labels, dense=dense, ready=ready)


def staged_inputs(batch: Batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense, labels) of `batch` on `device`, ready for the current stream.

    A staged batch's copy is waited for on the device (the current stream waits on its event) and
    its tensors are marked used by the current stream, so the allocator does not reuse their memory
    while the step still reads it.  A batch that was not staged is copied now.
    """
    if batch.ready is None:
        return host_to_device(batch.dense, device), host_to_device(batch.labels, device)
    stream = torch.cuda.current_stream(device)
    stream.wait_event(batch.ready)
    for t in (batch.dense, batch.labels):
        t.record_stream(stream)
    return batch.dense, batch.labels
