"""Serving exports: the exported network computes what the trained one does; deltas rebuild a table exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer import export
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel


def _trained(config: ModelConfig) -> CTRModel:
    """A model after a few Adam steps on random data (weights away from their initial values)."""
    torch.manual_seed(0)
    model = CTRModel(config, num_dense=13, num_fields=26, dim=8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(5):
        dense, emb, y = torch.rand(64, 13) * 5, torch.randn(64, 26, 8), torch.randint(0, 2, (64,)).float()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, emb), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


CONFIGS = [
    ModelConfig(num_heads=2, mlp_dims=(32, 16), dropout=0.0),
    ModelConfig(arch="deepfm", mlp_dims=(16,), dropout=0.0),
    ModelConfig(arch="dcn_v2", mlp_dims=(16,), cross_layers=2, dense_buckets=0, dropout=0.0),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["attention", "deepfm", "dcn_v2"])
def test_the_pt2_program_gives_the_trained_models_outputs_for_any_batch(config):
    model = _trained(config)
    net = export.load_program(export.program_bytes(export.export_program(model)))
    for batch in (1, 7, 300):
        dense, emb = torch.rand(batch, 13) * 5, torch.randn(batch, 26, 8)
        with torch.no_grad():
            want, got = torch.sigmoid(model(dense, emb)), torch.sigmoid(net(dense, emb))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_the_onnx_network_run_with_onnxruntime_gives_the_trained_models_outputs(tmp_path):
    if reason := export.onnx_missing():
        pytest.skip(reason)
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra brings onnxruntime: pip install '.[onnx]'")
    model = _trained(CONFIGS[0])
    session = ort.InferenceSession(export.onnx_bytes(model), providers=["CPUExecutionProvider"])
    for batch in (1, 50):
        dense, emb = torch.rand(batch, 13) * 5, torch.randn(batch, 26, 8)
        (logits,) = session.run(None, {"dense": dense.numpy(), "emb": emb.numpy()})
        with torch.no_grad():
            want = torch.sigmoid(model(dense, emb)).numpy()
        np.testing.assert_allclose(1 / (1 + np.exp(-logits)), want, atol=1e-5, rtol=0)


def _rows(keys, clock, seed=0, dim=3) -> export.SparseRows:
    keys = np.asarray(keys, np.int64)
    emb = np.random.default_rng(seed).normal(size=(keys.size, dim)).astype(np.float32)
    return export.SparseRows(keys, emb, np.asarray(clock, np.int64))


def test_a_delta_holds_rows_with_a_new_clock_new_keys_and_the_evicted_keys():
    base = _rows([1, 2, 3, 4], [5, 5, 5, 5])
    emb = base.emb.copy()
    emb[1] += 1  # key 2: trained again (clock moves)
    emb[2] += 1  # key 3: evicted and admitted again with the same clock count: only its value tells
    target = export.SparseRows(
        np.array([1, 2, 3, 9]), np.vstack([emb[:3], [[7, 7, 7]]]).astype(np.float32), np.array([5, 6, 5, 1])
    )
    delta = export.delta_rows(target, base)
    assert delta.rows.keys.tolist() == [2, 3, 9] and delta.evicted.tolist() == [4]
    assert (delta.by_clock, delta.by_value) == (2, 1)
    rebuilt = export.apply_delta(base, delta.rows, delta.evicted)
    assert export.rows_digest(rebuilt) == export.rows_digest(target)
    assert export.rows_digest(rebuilt) != export.rows_digest(base)


def test_a_chain_of_deltas_rebuilds_the_last_table_bit_for_bit_in_float16():
    rng = np.random.default_rng(1)
    tables = [_rows(np.arange(0, 200, 2), np.zeros(100))]
    for day in range(1, 4):  # each day: some rows train, some keys go, some come
        prev = tables[-1]
        keep = rng.random(len(prev)) > 0.1
        new = np.setdiff1d(rng.integers(0, 400, 20), prev.keys)
        keys = np.concatenate([prev.keys[keep], new])
        emb = np.concatenate([prev.emb[keep], rng.normal(size=(new.size, 3)).astype(np.float32)])
        clock = np.concatenate([prev.clock[keep], np.zeros(new.size, np.int64)])
        trained = rng.random(keys.size) < 0.3
        emb[trained] += 0.01 * day
        clock[trained] += 1
        order = np.argsort(keys)
        tables.append(export.SparseRows(keys[order], emb[order], clock[order]))
    half = [export.cast_rows(t, "float16") for t in tables]
    table = export.SparseRows(half[0].keys, half[0].emb)
    for prev, cur in zip(half, half[1:], strict=False):
        d = export.delta_rows(cur, prev)
        assert len(d.rows) < len(cur)
        table = export.apply_delta(table, d.rows, d.evicted)
    assert table.emb.dtype == np.float16
    assert export.rows_digest(table) == export.rows_digest(export.SparseRows(half[-1].keys, half[-1].emb))


def test_rows_of_another_dtype_are_refused():
    with pytest.raises(ValueError, match="dtype"):
        export.cast_rows(_rows([1], [0]), "int8")
    with pytest.raises(ValueError, match="one width and dtype"):
        export.delta_rows(export.cast_rows(_rows([1], [0]), "float16"), _rows([1], [0]))
