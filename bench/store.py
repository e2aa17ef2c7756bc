"""Benchmark of the tiered embedding store at scale, each part beside a baseline run in the same process.

    python -m bench.store            # index 10M keys, host, SSD, hit rates, scale 10^6 and 10^7
    python -m bench.store --quick    # small sizes, a minute or so
    python -m bench.store --smoke    # tiny sizes, seconds (checks it runs; the numbers mean nothing)
    python -m bench.store --max-keys 100000000 --parts scale   # the 10^8-key table (tens of GB of disk)

Parts (``--parts``, default all):

- ``index``: `KeyIndex.get` lookups/s on a 10M-key table vs `pandas.Index.get_indexer` on the same keys.
- ``host``: `HostStore.lookup` of resident rows/s vs `torch.index_select` on a dense tensor of the same rows.
- ``ssd``: `SsdStore` random row reads and writes/s (and MB/s) vs a raw O_DIRECT random 4 KiB read loop
  (same threads) over the same file, timed in turn after a warm-up of random updates.
- ``hitrate``: device-cache hit rate vs capacity (1/5/15/30% of distinct keys), LFU vs LRU, on the
  Criteo sample's key stream and on a synthetic stream with Criteo-like skew; HET's figure beside it.
  Then the LFU hit rate of a host tier at an equal budget in bytes, per row format (the same bytes
  hold more rows of a smaller format).
- ``scale``: tables of 10^6 .. --max-keys rows (dim 16) built on SSD and queried through a HostStore, each
  in a fresh process under a 2 GiB host budget, per row format (`--formats`: the fp32 + Adam rows of before
  as the baseline, the default rows, int8 rows with Adam's moments in log8, and int8 rows with row-wise
  AdaGrad): bytes per key on SSD and in
  DRAM, rows per 4 KiB unit,
  build rate, peak RSS, index bytes, SSD read and update cost per key.
- ``upgrade``: a shard of the 0.1.0 release (`ctr-ssd-shard/2`: fp32 rows with Adam's moments, dim 16) of 10^6 and
  10^7 keys converted where it lies to the default rows (`storage.embedding.ssd.upgrade`, what the warm stage does
  now), beside the rebuild it replaces (the shard wiped and restored from the published snapshot of the same rows,
  converted on the way), with each one's seconds per 10^8 keys extrapolated linearly from the measured sizes.

The host, ssd and index parts use the default row format (`StoreConfig()`, `OptimConfig().sparse_optimizer`).

Numbers go to bench/results/store_*.json.  Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from bench._common import add_smoke, report
from storage.embedding.config import StoreConfig
from storage.embedding.rows.batch import Rows
from storage.embedding.rows.format import RowFormat
from trainer.config import OptimConfig

DIM = 16
HOST_CAP_BYTES = 2 << 30
DEFAULT = StoreConfig(embedding_dim=DIM).row_format(OptimConfig().sparse_optimizer)
"""The rows a user's store keeps with the default config."""
FP32_ADAM = RowFormat(DIM, "adam", "fp32")
"""The rows of the releases before compact rows: the baseline of the format comparisons."""
COMPACT = RowFormat(DIM, "rowwise_adagrad", "int8")
"""The smallest row a user can choose without losing the per-key adaptive step: 36-byte SSD records."""
INT8_ADAM = RowFormat(DIM, "adam", "int8", "log8")
"""int8 rows with Adam's moments in log8: 64-byte records."""
FORMATS = tuple(dict.fromkeys((FP32_ADAM, DEFAULT, INT8_ADAM, COMPACT)))

# -- reporting -----------------------------------------------------------------------------


def best_rate(fn, items: int, repeat: int = 3) -> float:
    """Items per second of `fn()` (best of `repeat`: the least disturbed run on a shared box)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return items / best


def paired_rates(*fns, items: int, repeat: int = 5) -> tuple[float, ...]:
    """Items per second of each of `fns`, timed in turn on every repeat, best of `repeat` each.

    Alternating puts every side under the same load of a shared machine; timing one after the
    other let a burst of load land on one side only (ratios swung 2x between runs).
    """
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return tuple(items / t for t in best)


# -- index -----------------------------------------------------------------------------------


def bench_index(n_keys: int, batches: list[int]) -> None:
    import pandas as pd

    from storage.embedding.index import KeyIndex

    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(0, 2**62, int(n_keys * 1.01), dtype=np.int64))[:n_keys]
    keys = rng.permutation(keys)
    t0 = time.perf_counter()
    idx = KeyIndex(keys.size, value_dtype=np.int32)
    idx.insert(keys, np.arange(keys.size))
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    pidx = pd.Index(keys)
    pidx.get_indexer(keys[:1])  # builds pandas' hash table
    t_pd = time.perf_counter() - t0
    rows = [
        {
            "op": "build",
            "batch": keys.size,
            "ours_per_s": keys.size / t_ours,
            "pandas_per_s": keys.size / t_pd,
            "ratio": t_pd / t_ours,
        }
    ]
    for b in batches:
        # Many distinct batches (4M keys in all) for hits and misses alike: one batch repeated
        # would measure cache-resident cells for whichever side touches fewer bytes.
        n_batches = max(1, min(200, (4 << 20) // b))
        qs = [keys[rng.integers(0, keys.size, b)] for _ in range(n_batches)]
        misses = [rng.integers(0, 2**62, b, dtype=np.int64) for _ in range(n_batches)]  # almost surely absent
        assert np.array_equal(idx.get(qs[0]), pidx.get_indexer(qs[0]))  # noqa: S101 - checks the peer
        assert np.array_equal(idx.get(misses[0]), pidx.get_indexer(misses[0]))  # noqa: S101 - checks the peer
        for op, batch_list in (("lookup (hits)", qs), ("lookup (misses)", misses)):
            ours, theirs = paired_rates(
                lambda bl=batch_list: [idx.get(q) for q in bl],
                lambda bl=batch_list: [pidx.get_indexer(q) for q in bl],
                items=b * n_batches,
            )
            rows.append({"op": op, "batch": b, "ours_per_s": ours, "pandas_per_s": theirs, "ratio": ours / theirs})
    report(
        "store_index",
        rows,
        params={"keys": int(keys.size), "index_bytes": idx.nbytes, "value_dtype": "int32"},
        notes=(
            f"KeyIndex of {keys.size:,} keys: {idx.nbytes / keys.size:.1f} bytes/key (keys, int32 values, "
            "1-byte filter per cell, load 1/2); hits and misses over 4M keys in distinct batches, "
            "ours and pandas timed alternately (best of 5); goal: lookup ratio >= 1.0"
        ),
    )


# -- host ------------------------------------------------------------------------------------


def bench_host(n_rows: int, batches: list[int], total: int = 1 << 20) -> None:
    from storage.embedding.host import HostStore, host_row_bytes

    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 2**62, int(n_rows * 1.01), dtype=np.int64))[:n_rows]
    host = HostStore(DEFAULT, budget_bytes=(n_rows + 16) * host_row_bytes(DEFAULT))
    for lo in range(0, keys.size, 1 << 18):
        k = keys[lo : lo + (1 << 18)]
        host.write_rows(k, DEFAULT.fresh(torch.randn(k.size, DIM)))
    dense = torch.randn(n_rows, DIM)
    rows = []
    for b in batches:
        # Distinct batches (`total`, ~1M rows in all): one batch repeated keeps the baseline's rows in cache
        # (64k rows = 4 MB), which is not the memory-bound gather the goal compares against.
        n_batches = max(1, total // b)
        pos = [rng.integers(0, n_rows, b) for _ in range(n_batches)]
        qs = [torch.from_numpy(keys[p]) for p in pos]
        idxs = [torch.from_numpy(p) for p in pos]
        torch.testing.assert_close(
            host.lookup(qs[0]).rows, host._buf.gather_emb(host._resident.cache.map.lookup(keys[pos[0]]))
        )
        dense_np = dense.numpy()
        ours, base, take = paired_rates(
            lambda qs=qs: [host.lookup(q).rows for q in qs],
            lambda idxs=idxs: [dense.index_select(0, i) for i in idxs],
            lambda pos=pos, dense_np=dense_np: [np.take(dense_np, p, axis=0) for p in pos],
            items=b * n_batches,
        )
        rows.append(
            {
                "op": "lookup (emb rows)",
                "batch": b,
                "ours_rows_per_s": ours,
                "index_select_rows_per_s": base,
                "ratio": ours / base,
                "np_take_rows_per_s": take,
                "ratio_vs_np_take": ours / take,
            }
        )
        # full rows (weights, optimizer state, clock), what moves between tiers; the baseline gathers as many bytes
        full = DEFAULT.fresh(dense).tensors()
        full_np = [t.numpy() for t in full]
        uniq = [np.unique(keys[p]) for p in pos]
        ours, base, take = paired_rates(
            lambda uniq=uniq: [host.read_rows(k) for k in uniq],
            lambda idxs=idxs, full=full: [[t.index_select(0, i) for t in full] for i in idxs],
            lambda pos=pos, full_np=full_np: [[np.take(a, p, axis=0) for a in full_np] for p in pos],
            items=b * n_batches,
        )
        rows.append(
            {
                "op": "read_rows (full rows)",
                "batch": b,
                "ours_rows_per_s": ours,
                "index_select_rows_per_s": base,
                "ratio": ours / base,
                "np_take_rows_per_s": take,
                "ratio_vs_np_take": ours / take,
            }
        )
    report(
        "store_host",
        rows,
        params={"rows": n_rows, "dim": DIM, "row_format": DEFAULT.name, "torch_threads": torch.get_num_threads()},
        notes=(
            "HostStore path = key check + hash index + LFU bookkeeping + gather; ~1M rows per point in "
            "distinct batches, ours, index_select and np.take timed in turn (best of 5); goal: ratio (vs "
            "torch.index_select) >= 0.5.  np.take on the same dense array, one thread, is the stricter "
            "ceiling on a busy machine (torch's intra-op threads wake slowly there)"
        ),
    )


# -- ssd -------------------------------------------------------------------------------------


def _raw_random_reads(path: str, n_blocks: int, reads: int, threads: int, block: int = 4096) -> float:
    """Blocks/s of random aligned `block` reads with O_DIRECT, spread over `threads` (os.preadv drops the GIL)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    rng = np.random.default_rng(7)
    offs = (rng.integers(0, n_blocks, reads) * block).tolist()
    bufs = [mmap.mmap(-1, block) for _ in range(threads)]

    def run(i: int) -> None:
        buf = bufs[i]
        for off in offs[i::threads]:
            os.preadv(fd, [buf], off)

    try:
        with ThreadPoolExecutor(threads) as pool:
            t0 = time.perf_counter()
            list(pool.map(run, range(threads)))
            return reads / (time.perf_counter() - t0)
    finally:
        os.close(fd)


def bench_ssd(n_rows: int, batch: int, workdir: Path, threads: int, repeat: int = 3) -> None:
    from storage.embedding.ssd.store import SsdStore

    rng = np.random.default_rng(2)
    shard = workdir / "ssd-bench"
    shutil.rmtree(shard, ignore_errors=True)
    store = SsdStore(str(shard), DEFAULT, io_threads=threads)
    keys = np.arange(n_rows, dtype=np.int64) * 7 + 3
    store.reserve(n_rows)
    t0 = time.perf_counter()
    for lo in range(0, n_rows, 1 << 18):
        k = keys[lo : lo + (1 << 18)]
        store.write_rows(k, DEFAULT.fresh(torch.randn(k.size, DIM)))
    t_fill = time.perf_counter() - t0
    store.flush()
    fill_bytes = store.file_bytes
    rpu, ub, rb = store.rows_per_unit, store.unit_bytes, store.record_bytes
    n_batches = 8

    def batches() -> list[np.ndarray]:
        return [np.unique(keys[rng.integers(0, n_rows, batch)]) for _ in range(n_batches)]

    def units_of(qs: list[np.ndarray]) -> int:
        """Distinct 4 KiB units the rows of each batch sit in now: what a read costs."""
        return sum(np.unique(store._shard.index.lookup(q) // rpu).size for q in qs)

    # Warm-up: random updates of as many rows as the table holds, so writes are timed with
    # garbage in the file and reclamation running (a fresh file has none).
    done = 0
    while done < n_rows:
        for q in batches():
            store.write_rows(q, DEFAULT.fresh(torch.randn(q.size, DIM)))
            done += q.size
    # Time the raw loop, reads and writes in turn on every repeat (best of `repeat` each), each
    # on its own random batches, so every side sees the same load of a shared machine.
    best = {"raw": 0.0, "read": 0.0, "write": 0.0}
    per = {"read": {}, "write": {}}
    counters = ("bytes_read", "bytes_written", "gc_rows", "gc_units")
    for _ in range(repeat):
        qs = batches()
        n_q, units = sum(q.size for q in qs), units_of(qs)
        n_blocks = store.file_bytes // 4096
        raw = _raw_random_reads(str(store.rows_file), n_blocks, units, threads)
        best["raw"] = max(best["raw"], raw)
        t0 = time.perf_counter()
        for q in qs:
            store.read_rows(q)
        t = time.perf_counter() - t0
        if units / t > best["read"]:
            best["read"] = units / t
            per["read"] = {"rows_per_s": n_q / t, "units_per_s": units / t, "MB_per_s": units * ub / t / 1e6}
        qs = batches()
        n_q, units = sum(q.size for q in qs), units_of(qs)
        new = [DEFAULT.fresh(torch.randn(q.size, DIM)) for q in qs]
        c0 = {k: store.stats()["ssd"].get(k, 0) for k in counters}
        t0 = time.perf_counter()
        for q, r in zip(qs, new, strict=True):
            store.write_rows(q, r)
        t = time.perf_counter() - t0
        d = {k: store.stats()["ssd"].get(k, 0) - c0[k] for k in counters}
        if units / t > best["write"]:
            best["write"] = units / t
            per["write"] = {
                "rows_per_s": n_q / t,
                "units_per_s": units / t,
                "MB_per_s": units * ub / t / 1e6,
                "payload_MB_per_s": n_q * rb / t / 1e6,
                "device_MB_per_s": (d["bytes_read"] + d["bytes_written"]) / t / 1e6,
                "gc_rows_per_row": d["gc_rows"] / n_q,
                "gc_units_read_per_row": d["gc_units"] / n_q,
            }
    raw = best["raw"]
    rows = [
        {
            "op": "read_rows (random)",
            **per["read"],
            "raw_4k_reads_per_s": raw,
            "ratio_units_vs_raw": per["read"]["units_per_s"] / raw,
            "ratio_rows_vs_raw": per["read"]["rows_per_s"] / raw,
        },
        {
            "op": "write_rows (random)",
            **per["write"],
            "raw_4k_reads_per_s": raw,
            "ratio_units_vs_raw": per["write"]["units_per_s"] / raw,
            "ratio_rows_vs_raw": per["write"]["rows_per_s"] / raw,
        },
        {
            "op": "fill (sequential)",
            "rows_per_s": n_rows / t_fill,
            "units_per_s": fill_bytes / 4096 / t_fill,
            "MB_per_s": fill_bytes / t_fill / 1e6,
        },
    ]
    live_bytes = len(store) * rb
    file_bytes = store.file_bytes
    store.close()
    shutil.rmtree(shard, ignore_errors=True)
    report(
        "store_ssd",
        rows,
        params={
            "rows": n_rows,
            "dim": DIM,
            "row_format": DEFAULT.name,
            "batch": batch,
            "batches_per_repeat": n_batches,
            "repeat": repeat,
            "threads": threads,
            "fill_file_bytes": fill_bytes,
            "file_bytes": file_bytes,
            "space_amplification": file_bytes / live_bytes,
            "record_bytes": rb,
            "rows_per_unit": rpu,
            "gc_threshold": getattr(store, "gc_threshold", None),
        },
        notes=(
            "units/s: distinct 4 KiB units the batch's rows sat in (a random read costs one each), vs the raw "
            "O_DIRECT loop's random 4 KiB reads/s over the same file (same threads); after a warm-up of "
            "n_rows random row updates, the raw loop, reads and writes timed in turn, best of `repeat`.  "
            "Writes are log-structured (appended at the tail, no read-modify-write); gc_*_per_row: rows "
            "moved and units read by reclamation per written row.  Goal: ratio >= 0.7"
        ),
    )


# -- hit rate --------------------------------------------------------------------------------


def criteo_key_stream(path: str) -> np.ndarray:
    """Keys of C1..C26 of the Criteo sample in access order (row by row, field by field)."""
    import pandas as pd

    from pipeline.encode.keys import feature_keys

    cols = [f"C{i}" for i in range(1, 27)]
    names = ["label", *[f"I{i}" for i in range(1, 14)], *cols]
    df = pd.read_csv(path, sep="\t", header=None, names=names, dtype=str, keep_default_na=False)
    per_field = [feature_keys(j, df[c].to_numpy()) for j, c in enumerate(cols)]
    return np.stack(per_field, axis=1).reshape(-1)


def skewed_stream(n: int, distinct: int, s: float, seed: int = 3) -> np.ndarray:
    """`n` keys drawn from `distinct` keys with Zipf exponent `s` (rank r has weight r^-s)."""
    rng = np.random.default_rng(seed)
    w = np.arange(1, distinct + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n))
    ids = rng.permutation(distinct).astype(np.int64) * 1_000_003 + 11  # scatter ranks over the key space
    return ids[ranks]


def top_share(stream: np.ndarray, frac: float = 0.1) -> float:
    counts = np.sort(np.unique(stream, return_counts=True)[1])[::-1]
    return counts[: max(1, int(frac * counts.size))].sum() / counts.sum()


def bench_hitrate(criteo: str, synth_rows: int, batch_rows: int) -> None:
    from storage.embedding.slot_cache import simulate_hit_rates

    streams = {}
    if os.path.exists(criteo):
        streams["criteo_head_10k"] = criteo_key_stream(criteo)
    fields = 26
    streams[f"synthetic_{synth_rows:,}_keys"] = skewed_stream(synth_rows, max(1000, synth_rows // 10), 1.2)
    rows = []
    for name, stream in streams.items():
        distinct = np.unique(stream).size
        share = top_share(stream)
        for pct in (1, 5, 15, 30):
            cap = max(1, int(distinct * pct / 100))
            rates = {p: simulate_hit_rates(stream, cap, p, batch=batch_rows * fields) for p in ("lfu", "lru")}
            rows.append(
                {
                    "stream": name,
                    "lookups": int(stream.size),
                    "distinct": int(distinct),
                    "top10%_share": share,
                    "capacity_%": pct,
                    "capacity_rows": cap,
                    "lfu_hit": rates["lfu"]["distinct"],
                    "lru_hit": rates["lru"]["distinct"],
                    "lfu_hit_per_access": rates["lfu"]["access"],
                    "lru_hit_per_access": rates["lru"]["access"],
                    "HET_lfu_hit": 0.97 if pct == 15 else "",
                }
            )
    # the same host budget in bytes, per row format: compact rows fit more keys
    from storage.embedding.host import host_row_bytes

    by_bytes = []
    for name, stream in streams.items():
        distinct = np.unique(stream).size
        for pct in (1, 5, 15):
            budget = int(distinct * pct / 100) * host_row_bytes(FP32_ADAM)
            for fmt in FORMATS:
                cap = max(1, budget // host_row_bytes(fmt))
                r = simulate_hit_rates(stream, cap, "lfu", batch=batch_rows * fields)
                by_bytes.append(
                    {
                        "stream": name,
                        "budget_%_of_fp32_adam_table": pct,
                        "budget_MB": budget / 2**20,
                        "row_format": fmt.name,
                        "host_bytes_per_row": host_row_bytes(fmt),
                        "capacity_rows": cap,
                        "capacity_%": 100 * cap / distinct,
                        "lfu_hit": r["distinct"],
                        "lfu_hit_per_access": r["access"],
                    }
                )
    report(
        "store_hitrate_bytes",
        by_bytes,
        params={"batch_keys": batch_rows * fields, "formats": [f.name for f in FORMATS]},
        notes=(
            "A host tier of a fixed budget in bytes (1/5/15% of the distinct keys' fp32 + Adam rows): rows it "
            "holds per format (payload + 64 B of bookkeeping each, `storage.embedding.host.host_row_bytes`) "
            "and the LFU hit rate of the key stream through it (`slot_cache.simulate_hit_rates`)."
        ),
    )
    report(
        "store_hitrate",
        rows,
        params={"batch_keys": batch_rows * fields, "synthetic_zipf_s": 1.2},
        notes=(
            "lfu_hit / lru_hit: a distinct key of a batch found in the cache (what moves rows between tiers); "
            "*_per_access: every lookup counted (a batch's repeats of an admitted key hit), closer to "
            "how HET counts.  "
            "HET (VLDB'22) reports ~97% hits with LFU at 15% of the embeddings on full Criteo; the 10k-row "
            "sample has mostly one-off keys (compulsory misses), so its rate is bounded far below that."
        ),
    )


# -- scale -----------------------------------------------------------------------------------

_SCALE_CHILD = r"""
import json, os, resource, sys, time
import numpy as np, torch
from storage.embedding.host import HostStore, host_row_bytes
from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.store import SsdStore

n, dim, shard, budget, queries, qbatch = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                                          int(sys.argv[5]), int(sys.argv[6]))
fmt = RowFormat.parse(dim, sys.argv[7])
def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
base_rss = rss()
ssd = SsdStore(shard, fmt)
ssd.reserve(n)
step = 1 << 18  # rows per write: ~100 MB of temporaries, whatever n
t0 = time.perf_counter()
# keys: a stride over the key space (distinct, unsorted order of arrival per batch doesn't matter)
for lo in range(0, n, step):
    k = (np.arange(lo, min(n, lo + step), dtype=np.int64) * 0x9E3779B1) & ((1 << 62) - 1)
    emb = torch.from_numpy(np.random.default_rng(lo).standard_normal((k.size, dim), dtype=np.float32) * 0.01)
    ssd.write_rows(k, fmt.fresh(emb))
    del k, emb
ssd.flush()
t_build = time.perf_counter() - t0
build_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
rss_built = rss()
index_bytes = ssd._shard.index.nbytes
file_bytes = ssd.file_bytes
t0 = time.perf_counter()
ssd.close()  # releases the index
del ssd
ssd = SsdStore(shard, fmt)  # reopen: the persisted index is read back
t_reopen = time.perf_counter() - t0
assert len(ssd) == n
host = HostStore(fmt, budget_bytes=budget, below=ssd)
rng = np.random.default_rng(0)
warm_q = torch.from_numpy((rng.integers(0, n, qbatch) * 0x9E3779B1) & ((1 << 62) - 1))
host.lookup(warm_q).rows
t0 = time.perf_counter()
done = 0
while done < queries:
    q = torch.from_numpy((rng.integers(0, n, qbatch) * 0x9E3779B1) & ((1 << 62) - 1))
    host.update(q, torch.ones(qbatch, dim), lr=0.01)
    done += qbatch
t_upd = time.perf_counter() - t0
# index-only lookups (the part of the cost that depends on the table size)
qk = (rng.integers(0, n, 1 << 16) * 0x9E3779B1) & ((1 << 62) - 1)
t0 = time.perf_counter()
for _ in range(20):
    ssd._shard.index.lookup(qk)
t_idx = (time.perf_counter() - t0) / (20 << 16)
miss = rng.integers(0, 1 << 62, 1 << 16)
t0 = time.perf_counter()
for _ in range(20):
    ssd._shard.index.lookup(miss)
t_miss = (time.perf_counter() - t0) / (20 << 16)
t0 = time.perf_counter()
found, _ = ssd.read_rows(np.unique(qk))
t_read = (time.perf_counter() - t0) / np.unique(qk).size
assert found.all()
host.close()
print(json.dumps({
    "row_format": fmt.name, "record_bytes": ssd.record_bytes, "rows_per_4k_unit": ssd.rows_per_unit,
    "ssd_bytes_per_key": file_bytes / n, "host_bytes_per_row": host_row_bytes(fmt),
    "dram_bytes_per_key_on_ssd": index_bytes / n,
    "keys": n, "build_s": t_build, "build_rows_per_s": n / t_build, "file_GB": file_bytes / 1e9,
    "index_MB": index_bytes / 2**20, "index_bytes_per_key": index_bytes / n,
    "index_lookup_ns_per_key": t_idx * 1e9, "index_miss_ns_per_key": t_miss * 1e9,
    "ssd_read_us_per_key": t_read * 1e6, "host_update_us_per_key": t_upd / done * 1e6,
    "reopen_s": t_reopen, "rss_after_build_MB": rss_built, "build_peak_rss_MB": build_peak,
    "base_rss_MB": base_rss, "peak_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def bench_scale(
    sizes: list[int], workdir: Path, budget: int, queries: int, qbatch: int, formats: list[RowFormat]
) -> None:
    from storage.embedding.ssd.disk_format import RecordLayout

    rows = []
    for n, fmt in itertools.product(sizes, formats):
        shard = workdir / f"scale-{n}"
        shutil.rmtree(shard, ignore_errors=True)
        need = n * 4096 / RecordLayout.of(fmt).rows_per_unit * 1.05
        free = shutil.disk_usage(workdir).free
        if need > free * 0.9:
            print(f"scale: skipping {n:,} keys of {fmt.name}: needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
            continue
        print(f"scale: {n:,} keys of {fmt.name} ...", flush=True)
        cmd = [
            sys.executable,
            "-c",
            _SCALE_CHILD,
            str(n),
            str(DIM),
            str(shard),
            str(budget),
            str(queries),
            str(qbatch),
            fmt.name,
        ]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1])
        except subprocess.CalledProcessError as exc:
            print(exc.stderr[-3000:])
            raise
        finally:
            shutil.rmtree(shard, ignore_errors=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["dram_bytes_per_hot_key"] = r["dram_bytes_per_key_on_ssd"] + r["host_bytes_per_row"]
        base = next((x for x in rows if x["keys"] == n and x["row_format"] == FP32_ADAM.name), None)
        if base is not None and fmt != FP32_ADAM:
            r["ssd_bytes_ratio_vs_fp32_adam"] = r["ssd_bytes_per_key"] / base["ssd_bytes_per_key"]
            r["build_rate_ratio_vs_fp32_adam"] = r["build_rows_per_s"] / base["build_rows_per_s"]
            r["ssd_read_ratio_vs_fp32_adam"] = r["ssd_read_us_per_key"] / base["ssd_read_us_per_key"]
            r["host_update_ratio_vs_fp32_adam"] = r["host_update_us_per_key"] / base["host_update_us_per_key"]
        r["cap_MB"] = budget / 2**20
        r["rss_over_cap_MB"] = r["peak_rss_MB"] - budget / 2**20
        rows.append(r)
    report(
        "store_scale",
        rows,
        params={
            "dim": DIM,
            "host_budget_bytes": budget,
            "queries": queries,
            "query_batch": qbatch,
            "formats": [f.name for f in formats],
        },
        notes=(
            "Each size and row format in a fresh process (the fp32 + Adam baseline first): SsdStore built in "
            "256k-row batches, closed and reopened (index read back), then HostStore(budget) over it takes "
            "optimizer updates of random keys.  ssd_bytes_per_key = row file / keys; dram_bytes_per_key_on_ssd = "
            "the index (CompactSlotMap: sorted uint64 key hashes + int32 slots + a directory, ~12.5 B/key); "
            "dram_bytes_per_hot_key adds a host row (payload + 64 B bookkeeping).  Peak RSS = Python+torch "
            "baseline + index + host rows (<= budget); index lookups: 65536 random keys per call."
        ),
    )


SIZES = {
    "full": {
        "index": 10_000_000,
        "host": 2_000_000,
        "gathered": 1 << 20,
        "ssd": 4_000_000,
        "hitrate": 10_000_000,
        "scale": 10**7,
        "queries": 1 << 20,
    },
    "quick": {
        "index": 1_000_000,
        "host": 200_000,
        "gathered": 1 << 20,
        "ssd": 200_000,
        "hitrate": 1_000_000,
        "scale": 10**6,
        "queries": 1 << 18,
    },
    "smoke": {
        "index": 20_000,
        "host": 20_000,
        "gathered": 1 << 14,
        "ssd": 20_000,
        "hitrate": 20_000,
        "scale": 10**4,
        "queries": 1 << 12,
    },
}
"""Keys / rows / lookups per part (`gathered`: rows looked up per host batch size): the default, `--quick` (a minute or
so) and `--smoke` (seconds; the first
row format only)."""


def write_v2_shard(path: Path, keys: np.ndarray, seed: int = 0, tag: str = "published", dim: int = DIM) -> Rows:
    """A shard as the 0.1.0 release wrote it (`ctr-ssd-shard/2`, closed cleanly, tagged `tag`) holding random fp32
    Adam rows of `keys`; returns the rows (int32 clock)."""
    from storage.embedding.ssd import disk_format
    from storage.embedding.ssd.compact_index import CompactSlotMap
    from storage.embedding.ssd.shard_file import ShardFile

    layout = disk_format.RecordLayout.v2(dim)
    g = torch.Generator().manual_seed(seed)
    n = keys.size
    rows = Rows(
        torch.randn(n, dim, generator=g) * 0.05,
        {"m": torch.randn(n, dim, generator=g) * 1e-3, "v": torch.rand(n, dim, generator=g) * 1e-4},
        torch.randint(0, 1000, (n,), generator=g, dtype=torch.int32),
    )
    path.mkdir(parents=True)
    shard = ShardFile(path, layout, CompactSlotMap(), gc_threshold=0.5, direct_io=True, io_threads=4)
    for lo in range(0, n, 1 << 18):
        k = keys[lo : lo + (1 << 18)]
        shard.write(k, layout.to_records(k, rows.select(np.arange(lo, lo + k.size))))
    shard.file.fsync()
    disk_format.write_index(path, disk_format.index_name(1), shard.index)
    shard.close()
    sizes = {
        "record_bytes": layout.record_bytes,
        "unit_bytes": layout.unit_bytes,
        "rows_per_unit": layout.rows_per_unit,
    }
    meta = {"format": disk_format.V2, "dim": dim, "block": 4096, **sizes, "generation": 1, "clean": True}
    disk_format.write_meta(path, {**meta, "index": disk_format.index_name(1), "tag": tag, "rows": n})
    return rows


def _uncached(path: Path) -> None:
    """Drop `path`'s pages from the page cache (written, synced): read back from the disk, as a day's would be."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_upgrade(sizes: list[int], workdir: Path) -> None:
    """The ``upgrade`` part (module docstring): convert in place vs rebuild from the snapshot, per size; wall and
    CPU seconds (this process's), the files read from the disk, not the page cache."""
    from storage.embedding.snapshot import SnapshotWriter
    from storage.embedding.ssd.store import SsdStore
    from storage.embedding.ssd.upgrade import PER, convert_shard

    out = []
    for n in sizes:
        keys = np.arange(n, dtype=np.int64) * 7 + 3
        shard, snapshot = workdir / f"upgrade-{n}", workdir / f"upgrade-{n}.parquet"
        rows = write_v2_shard(shard, keys)
        with SnapshotWriter(str(snapshot), FP32_ADAM) as w:  # the published model's rows (0.1.0 wrote fp32 Adam)
            for lo in range(0, n, 1 << 18):
                w.write(keys[lo : lo + (1 << 18)], rows.select(np.arange(lo, min(n, lo + (1 << 18)))))
        v2_bytes = (shard / "rows.bin").stat().st_size
        for path in (shard / "rows.bin", snapshot):
            _uncached(path)
        t0, c0 = time.perf_counter(), time.process_time()
        converted = convert_shard(shard, DEFAULT, init_std=0.01, tag="published")
        took = {"convert in place (now)": (time.perf_counter() - t0, time.process_time() - c0)}
        with SsdStore(str(shard), DEFAULT) as s:
            if converted is None or converted.rows != n or len(s) != n or s.tag != "published":
                raise RuntimeError(f"the conversion of {n} keys left {len(s)} rows tagged {s.tag}: {converted}")
            new_bytes = s.file_bytes
        shutil.rmtree(shard)
        t0, c0 = time.perf_counter(), time.process_time()
        with SsdStore(str(shard), DEFAULT) as s:  # what the warm stage did before: wipe, restore from the snapshot
            s.restore(str(snapshot))
        took["rebuild from snapshot (before)"] = (time.perf_counter() - t0, time.process_time() - c0)
        shutil.rmtree(shard)
        snapshot.unlink()
        for path, (secs, cpu) in took.items():
            out.append(
                {
                    "keys": n,
                    "path": path,
                    "seconds": secs,
                    "cpu_s": cpu,
                    "keys_per_s": n / secs,
                    "s_per_1e8_keys": secs / n * PER,
                    "cpu_s_per_1e8_keys": cpu / n * PER,
                    "v2_MB": v2_bytes / 1e6,
                    "new_MB": new_bytes / 1e6,
                }
            )
    report(
        "store_upgrade",
        out,
        params={
            "dim": DIM,
            "from": "ctr-ssd-shard/2 adam/fp32",
            "to": DEFAULT.name,
            "sizes": sizes,
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        },
        notes="s_per_1e8_keys: the measured seconds scaled linearly to 10^8 keys (one shard, one process); cpu_s: "
        "this process's CPU seconds (both paths convert the rows the same way: the rebuild also reads the snapshot).",
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a minute or so)")
    add_smoke(ap)
    ap.add_argument(
        "--parts",
        nargs="+",
        default=["index,host,ssd,hitrate,scale,upgrade"],
        help="parts to run, space- or comma-separated (index host ssd hitrate scale upgrade)",
    )
    ap.add_argument("--max-keys", type=int, default=None, help="largest table of the scale part (default 10^7)")
    ap.add_argument("--workdir", default=None, help="directory for SSD files (default: a temp dir under /work or /tmp)")
    ap.add_argument("--threads", type=int, default=4, help="I/O threads for the SSD part")
    ap.add_argument("--criteo", default="/work/shared/data/criteo/train_head_10k.tsv")
    ap.add_argument(
        "--formats",
        nargs="+",
        default=[f.name for f in FORMATS],
        help="row formats of the scale part, optimizer/row_dtype[/state_dtype] (default: fp32 Adam, the "
        "default, adam/int8/log8, rowwise_adagrad/int8)",
    )
    args = ap.parse_args(argv)
    formats = [RowFormat.parse(DIM, f) for f in args.formats]
    parts = {p for arg in args.parts for p in arg.split(",") if p}
    unknown = parts - {"index", "host", "ssd", "hitrate", "scale", "upgrade"}
    if unknown:
        ap.error(f"unknown --parts {sorted(unknown)}; choose from index, host, ssd, hitrate, scale, upgrade")
    size = SIZES["smoke" if args.smoke else "quick" if args.quick else "full"]
    if args.smoke:
        formats = formats[:1]
    base = args.workdir or ("/work" if os.access("/work", os.W_OK) else None)
    with tempfile.TemporaryDirectory(prefix="bench-store-", dir=base) as tmp:
        work = Path(tmp)
        if "index" in parts:
            bench_index(size["index"], [b for b in [4096, 65536, 1 << 20] if b <= size["index"]] or [4096])
        if "host" in parts:
            bench_host(size["host"], [b for b in [4096, 65536] if b <= size["host"]], size["gathered"])
        if "ssd" in parts:
            bench_ssd(size["ssd"], min(65536, size["ssd"]), work, args.threads, repeat=1 if args.smoke else 3)
        if "hitrate" in parts:
            bench_hitrate("" if args.smoke else args.criteo, size["hitrate"], 512)  # smoke: synthetic keys only
        if "scale" in parts:
            max_keys = args.max_keys or size["scale"]
            smallest = 10**4 if args.smoke else 10**5 if args.quick else 10**6
            sizes = [n for n in (10**4, 10**5, 10**6, 10**7, 10**8, 10**9) if smallest <= n <= max_keys]
            if max_keys not in sizes:
                sizes.append(max_keys)
            bench_scale(sizes, work, HOST_CAP_BYTES, size["queries"], 1 << 14, formats)
        if "upgrade" in parts:
            bench_upgrade([10**4] if args.smoke else [10**5, 10**6] if args.quick else [10**6, 10**7], work)


if __name__ == "__main__":
    main()
