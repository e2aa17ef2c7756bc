"""Peer check: our row-wise AdaGrad against fbgemm's TBE `EXACT_ROWWISE_ADAGRAD` on the same gradients.

`sparse_optim.RowwiseAdagrad` claims fbgemm's semantics (duplicates summed, `acc += mean(g^2)`,
`row -= lr * g / (sqrt(acc) + eps)`); this runs both on one table and compares weights and accumulators.
fbgemm-gpu-cpu is not a project dependency (CI skips this module); `make bench-peers` installs it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.memory import MemoryStore
from storage.embedding.rows.format import RowFormat
from storage.embedding.rows.sparse_optim import ADAGRAD_EPS

fbgemm = pytest.importorskip("fbgemm_gpu", reason="fbgemm-gpu-cpu is not installed (make bench-peers installs it)")
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: E402
    ComputeDevice,
    EmbeddingLocation,
    OptimType,
    PoolingMode,
    SplitTableBatchedEmbeddingBagsCodegen,
)

ROWS, DIM, LR, STEPS, BATCH = 50, 8, 0.05, 5, 40
USED = 40
"""Batches draw keys below USED only, so the last rows are never touched (both sides must leave them alone)."""


def _tbe(initial: torch.Tensor) -> SplitTableBatchedEmbeddingBagsCodegen:
    """A one-table CPU TBE holding `initial`, without pooling: one output row per looked-up index."""
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(ROWS, DIM, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        optimizer=OptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=LR,
        eps=ADAGRAD_EPS,
        weight_decay=0.0,
        pooling_mode=PoolingMode.NONE,
    )
    tbe.split_embedding_weights()[0].copy_(initial)  # a view of the TBE's host weights
    return tbe


@pytest.mark.parametrize("scale", [1.0, 1e-8], ids=["unit-grads", "grads-near-eps"])
def test_rowwise_adagrad_matches_fbgemm_tbe_on_the_same_gradients(scale: float) -> None:
    """Several steps of batches with repeated keys: both sum a key's gradients, step each row once, and keep one
    accumulator per row equal to the mean of the squared summed gradient, so weights and state agree to rounding.
    With gradients of about eps, sqrt(acc) is too, so only `sqrt(acc) + eps` (not `sqrt(acc + eps)`) agrees."""
    gen = torch.Generator().manual_seed(7)
    fmt = RowFormat(DIM, "rowwise_adagrad", "fp32")
    store = MemoryStore(fmt, init_std=0.05)
    all_keys = np.arange(ROWS, dtype=np.int64)
    initial = torch.randn(ROWS, DIM, generator=gen) * 0.05
    store.write_rows(all_keys, fmt.fresh(initial))
    tbe = _tbe(initial)
    assert torch.equal(tbe.split_embedding_weights()[0], store.read_rows(all_keys)[1].emb), "same start"

    touched = torch.zeros(ROWS, dtype=torch.bool)
    unsummed_acc = torch.zeros(ROWS)  # what acc would be if each occurrence were a step of its own
    for step in range(STEPS):
        keys = torch.randint(0, USED, (BATCH,), generator=gen)
        assert keys.unique().numel() < BATCH, "the batch repeats some keys, so duplicate summing is exercised"
        grads = torch.randn(BATCH, DIM, generator=gen) * (0.5 + step) * scale  # growing magnitude: acc history matters
        out = tbe(keys, torch.arange(BATCH + 1))
        assert out.shape == (BATCH, DIM)
        (out * grads).sum().backward()  # d loss / d out = grads; TBE applies its fused update in backward
        store.update(keys, grads, lr=LR)
        touched[keys] = True
        unsummed_acc.index_add_(0, keys, (grads * grads).mean(dim=1))

    found, rows = store.read_rows(all_keys)
    assert found.all()
    ours_w, ours_acc = rows.emb, rows.state["acc"]
    fb_w = tbe.split_embedding_weights()[0].clone()
    fb_acc = tbe.split_optimizer_states()[0][0].clone()
    assert fb_acc.shape == (ROWS,), "exact row-wise AdaGrad keeps one accumulator per row"

    torch.testing.assert_close(ours_w, fb_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours_acc, fb_acc, rtol=1e-5, atol=0.0)  # relative: acc is ~1e-16 near eps

    # the comparison is not vacuous: touched rows moved (by about lr per step) and gathered state; others did not
    assert not touched[USED:].any() and int(touched.sum()) > USED // 2
    moved = (fb_w - initial).abs().amax(dim=1)
    assert (moved[touched] > 0.1 * LR).all()
    assert torch.equal(fb_w[~touched], initial[~touched]) and torch.equal(ours_w[~touched], initial[~touched])
    assert (ours_acc[touched] > 0).all() and (ours_acc[~touched] == 0).all()
    assert (rows.clock[~touched] == 0).all()
    # and it tells the rules apart: fbgemm squares a key's summed gradient, not each occurrence's
    assert not torch.allclose(fb_acc[touched], unsummed_acc[touched], rtol=1e-3, atol=0.0)
