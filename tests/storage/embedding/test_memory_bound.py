"""A host tier over SSD holds its memory bound while training evicts, and loses no row doing it.

The bound (issue 54): a rank's memory for rows is `store.host_budget_mb`, plus the SSD index's ~12.5 B per key,
plus a stated overhead (`OVERHEAD_MB`: rows in flight, a batch's temporaries).  Here at small scale: 60,000 keys of
64-wide fp32 Adam rows (~46 MB in all) against a 4 MiB budget (~8% of them fit), 120 steps that look up and update
Zipf-drawn keys as a training step does.  The store runs in a fresh process, so its peak RSS is its own; an
unbounded `MemoryStore` runs the same steps here, and every row read along the way and every row at the end
(weights and Adam state) must equal its.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from storage.embedding.base import EmbeddingStore
from storage.embedding.memory import MemoryStore

REPO = Path(__file__).resolve().parents[3]
KEYS, DIM, BUDGET_MB, STEPS, BATCH = 60_000, 64, 4, 120, 2048
INDEX_BYTES_PER_KEY = 12.5
OVERHEAD_MB = 24
"""Overhead beyond the budget and the index, once the runtime is up: the host tier's row buffer grows by doubling up
to the budget, holding old and new during the copy (up to ~budget); up to `behind.MAX_IN_FLIGHT` batches of rows in
flight on the SSD thread (~1.6 MB each here) and one read ahead; a batch's temporaries and aligned I/O buffers
(measured: 17-21 MiB of growth in all, where all rows would take ~48 MiB)."""

FIXED_MALLOC = {
    "MALLOC_ARENA_MAX": "2",
    "MALLOC_MMAP_THRESHOLD_": str(1 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(4 << 20),
}
"""glibc's thresholds fixed: by default they move with what was freed, and each of the shard's I/O threads keeps an
arena, so freed heap held back (up to ~200 MiB seen here) would depend on thread timing.  A rank sets its own
(`trainer.malloc.tune_malloc`: up to 256 MiB of free heap kept, part of a rank's runtime overhead)."""

_CHILD = r"""
import json, sys
import torch
from storage.embedding.host import HostStore
from storage.embedding.ssd.store import SsdStore
from tests.storage.embedding.test_memory_bound import BUDGET_MB, DIM, KEYS, peak_mb, rss_mb, train

torch.set_num_threads(1)
shard, out = sys.argv[1], sys.argv[2]
# The runtime's one-time cost (torch's first operators, the allocator's arenas: ~30 MiB whatever the budget) is paid
# by a first store, on a shard of its own, before the baseline.
first = HostStore(DIM, budget_bytes=1 << 20, below=SsdStore(shard + "-runtime", DIM, init_std=0.01), init_std=0.01)
for _, _s in zip(range(10), train(first)):
    pass
first.close()
del first
with open("/proc/self/clear_refs", "w") as f:  # the peak (VmHWM) restarts here: the warm-up's is not the store's
    f.write("5")
base = rss_mb()
ssd = SsdStore(shard, DIM, init_std=0.01, write_behind=True)  # as the tier stack opens it
store = HostStore(DIM, budget_bytes=BUDGET_MB << 20, below=ssd, init_std=0.01)
digests = list(train(store))
peak = peak_mb()
stats = store.stats()
found, rows = store.read_rows(torch.arange(KEYS).numpy())
torch.save({"found": torch.from_numpy(found), "rows": rows.tensors()}, out + ".pt")
json.dump({"base_mb": base, "peak_mb": peak, "digests": digests, "stats": stats}, open(out, "w"), default=str)
store.close()
"""


def rss_mb() -> float:
    """This process's resident set now, in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def peak_mb() -> float:
    """This process's peak resident set (VmHWM) in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def batches() -> Iterator[np.ndarray]:
    """Every key once (in order: the day's first sight of each), then Zipf-skewed batches, as a day's steps."""
    yield from np.array_split(np.arange(KEYS), KEYS // BATCH)
    rng = np.random.default_rng(0)
    for _ in range(STEPS - KEYS // BATCH):
        yield np.minimum(rng.zipf(1.2, BATCH) - 1, KEYS - 1)


def train(store: EmbeddingStore) -> Iterator[str]:
    """Run the steps on `store`: look each batch up, hint the next one (`prefetch`), update it with gradients fixed
    by the keys; yield a digest of the rows each lookup returned (equal stores yield equal digests)."""
    steps = list(batches())
    for keys, following in zip(steps, [*steps[1:], None], strict=True):
        k = torch.from_numpy(keys)
        looked = store.lookup(k)
        if following is not None:  # as the trainer does: the next batch's rows are read from SSD meanwhile
            store.prefetch(following)
        yield hashlib.sha1(looked.rows.contiguous().numpy().tobytes(), usedforsecurity=False).hexdigest()
        grads = ((k % 7).float() - 3).unsqueeze(1) * torch.linspace(-1, 1, DIM) * 0.1 + looked.rows
        store.update(looked, grads, lr=0.05)


@pytest.mark.subprocess
@pytest.mark.slow
def test_peak_rss_stays_within_budget_plus_index_and_every_row_survives_eviction(tmp_path: Path) -> None:
    out = tmp_path / "child.json"
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", **FIXED_MALLOC}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path / "shard"), str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(out.read_text())
    host, ssd = child["stats"]["host"], child["stats"]["ssd"]
    assert host["capacity"] < KEYS // 10 and host["evictions"] > KEYS, host  # most rows live on SSD, and moved a lot
    assert ssd["rows"] >= KEYS - host["capacity"] and ssd["bytes_read"] > 0, ssd
    assert ssd["from_memory"] > 0, ssd  # lookups took rows read ahead, and still equal the reference's below

    growth = child["peak_mb"] - child["base_mb"]
    bound = BUDGET_MB + KEYS * INDEX_BYTES_PER_KEY / 2**20 + OVERHEAD_MB
    all_rows_mb = KEYS * host["bytes_held"] / max(1, host["rows"]) / 2**20
    assert bound < all_rows_mb  # the bound is below what holding every row would take: it can fail
    assert growth <= bound, f"peak RSS grew {growth:.1f} MiB over the bound {bound:.1f} MiB"

    reference = MemoryStore(DIM, init_std=0.01)
    assert child["digests"] == list(
        train(reference)
    )  # every lookup read, bit for bit, the rows an unbounded store holds
    got = torch.load(str(out) + ".pt")
    found, want = reference.read_rows(torch.arange(KEYS).numpy())
    assert bool(got["found"].all()) and found.all()
    for g, w in zip(got["rows"], want.tensors(), strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)  # weights and Adam state, bit for bit
