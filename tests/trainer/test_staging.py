"""Staging: on CPU a batch is used where it is; a batch that was not staged is moved at the step."""

from __future__ import annotations

import torch

from trainer.data import Batch
from trainer.staging import BatchStager, staged_inputs


def _batch() -> Batch:
    return Batch(labels=torch.ones(4), dense=torch.rand(4, 2), keys=torch.arange(8).reshape(4, 2))


def test_staging_on_cpu_moves_nothing() -> None:
    batch = _batch()
    staged = BatchStager(torch.device("cpu"))(batch)
    assert staged is batch and staged.ready is None
    dense, labels = staged_inputs(staged, torch.device("cpu"))
    assert dense is batch.dense and labels is batch.labels
