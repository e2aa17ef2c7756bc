"""Rows in memory and memory-mapped through the key index answer alike; a broken delta chain is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flows.serving.bundle import BundleError, BundleReader, npy_bytes, write_bundle
from flows.serving.export import row_files
from flows.serving.tables import MmapTable, chain_table, memory_table
from storage.embedding.rows.initial import init_rows
from trainer.export import SparseRows, delta_rows, rows_digest


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_the_mmap_table_answers_like_the_in_memory_one_unknown_keys_included(tmp_path, dtype):
    rng = np.random.default_rng(0)
    keys = np.sort(rng.choice(1 << 40, 5000, replace=False)).astype(np.int64)
    emb = rng.normal(size=(keys.size, 6)).astype(dtype)
    np.save(tmp_path / "emb.npy", emb)
    mapped = MmapTable(keys, str(tmp_path / "emb.npy"), init_std=0.1)
    memory = memory_table(SparseRows(keys, emb), init_std=0.1)
    query = torch.from_numpy(np.concatenate([keys[rng.integers(0, keys.size, 300)], [3, 3, 1 << 41]]))
    got = mapped.lookup(query)
    torch.testing.assert_close(got, memory.lookup(query), rtol=0, atol=0)
    torch.testing.assert_close(got[-3:], init_rows(query[-3:], 6, 0.1))  # never trained: their initial rows
    assert got.dtype == torch.float32 and len(mapped) == keys.size
    assert mapped.resident_bytes == mapped.index.nbytes < emb.nbytes * 4


def _commit(tmp_path, name, rows, manifest, evicted=None):
    files = row_files(rows) | ({"evicted.npy": npy_bytes(evicted)} if evicted is not None else {})
    write_bundle(str(tmp_path / name), files, manifest)
    return BundleReader(str(tmp_path / name))


def test_a_chain_must_start_full_follow_its_bases_and_reach_the_targets_digest(tmp_path):
    k = np.arange(10, dtype=np.int64)
    base = SparseRows(k, np.ones((10, 2), np.float32), np.zeros(10, np.int64))
    target = SparseRows(k[2:], np.vstack([np.ones((7, 2)), [[5, 5]]]).astype(np.float32), np.r_[np.zeros(7), 3])
    d = delta_rows(target, base)
    full = _commit(tmp_path, "v1", base, {"version": "v00001", "kind": "full", "rows_digest": rows_digest(base)})
    good = {
        "version": "v00002",
        "kind": "delta",
        "base_version": "v00001",
        "base_rows_digest": rows_digest(base),
        "rows_digest": rows_digest(SparseRows(target.keys, target.emb)),
    }
    delta = _commit(tmp_path, "v2", d.rows, good, d.evicted)
    table = chain_table([full, delta])
    assert table.keys.tolist() == list(range(2, 10)) and table.emb[-1].tolist() == [5, 5]
    with pytest.raises(BundleError, match="starts with a full bundle"):
        chain_table([delta])
    other = _commit(tmp_path, "v2b", d.rows, {**good, "base_version": "v00003"}, d.evicted)
    with pytest.raises(BundleError, match="does not follow v00001"):
        chain_table([full, other])
    wrong = _commit(tmp_path, "v2c", d.rows, {**good, "rows_digest": "0" * 64}, d.evicted)
    with pytest.raises(BundleError, match="differ from the version's own"):
        chain_table([full, wrong])
