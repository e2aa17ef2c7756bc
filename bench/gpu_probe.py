"""The trainer's checks on a GPU, in one process: `python -m bench.gpu_probe --out probe.json`.

What `make gpu-check` (infra/gpu-check.sh) runs between the CUDA conformance tests and the CLI day:

- `world`: `trainer.nproc_per_node: auto` and the refusal of more NCCL ranks than GPUs, on this host;
- `nccl`: a one-rank NCCL group through the collectives the trainer issues (CUDA only);
- `host_reads`: one `train_step` (after warm-up) with `torch.cuda.set_sync_debug_mode("warn")`, each
  synchronisation by source line, for the host store (`store.device_cache_rows: 0`: the push's copy of the
  gradients) and the CUDA default (`auto`: the device tier; tests/trainer/test_step_host_reads.py counts the
  same on CPU by kind);
- `sync_free_step`: the CUDA default's steps between log points under `set_sync_debug_mode("error")`: any
  synchronisation raises, and the section reports where (`make gpu-check` fails on it);
- `phases`: mean ms of pull / forward / backward / push / dense Adam (a device sync after each);
- `throughput`: examples/s of `train_step` fp32 and bf16, host store and device cache, and on CPU;
- `determinism`: two identical runs, with and without `trainer.deterministic`: bitwise equal, or
  the largest difference (docs/user-guide.md, "Configure": processes, precision and determinism);
- `restore_memory`: peak device memory while a device cache restores a snapshot, against its buffer.

Every section also runs with `--device cpu` (a dry run of the probe's code; `tests/bench` does it),
where the CUDA-only sections report `skipped`.  Each section writes its result as it finishes, so a
probe cut short by its time budget still leaves what it measured.  `--smoke`: `--device cpu` and the
sections of SMOKE_SECTIONS (seconds; checks it runs); `--out` defaults to <results>/gpu_probe.json.  The exit status
is 1 when a section ended in error, or one that needs CUDA was skipped on `--device cuda`.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bench._common import add_smoke, apply_smoke, results_dir
from storage.embedding.config import StoreConfig
from storage.embedding.snapshot import read_snapshot
from storage.embedding.tiered import open_shard
from trainer.bags import expand_cells, pool_rows
from trainer.config import OptimConfig, TrainerConfig
from trainer.data import Batch
from trainer.distributed.context import init_distributed
from trainer.distributed.sharded_embedding import ShardedEmbedding
from trainer.launch.world import resolve_world, visible_gpus
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.precision import Precision
from trainer.step import train_step

REPO = Path(__file__).resolve().parents[1]
FIELDS, DENSE, DIM = 26, 13, 16


def batches(n: int, *, batch: int = 1024, seed: int = 0) -> list[Batch]:
    """Criteo-shaped synthetic batches: Zipf keys per field, log-normal dense features."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        vals = (g.zipf(1.15, (batch, FIELDS)) % 50_000 + 2).astype(np.int64)
        keys = (np.arange(FIELDS, dtype=np.int64)[None, :] << 56) | vals
        dense = np.log1p(np.maximum(g.standard_normal((batch, DENSE)) * 3, 0)).astype(np.float32)
        labels = (g.random(batch) < 0.25).astype(np.float32)
        out.append(Batch(torch.from_numpy(labels), torch.from_numpy(dense), torch.from_numpy(keys)))
    return out


class Rank:
    """One rank's model, optimizer and sharded store on `device` (world of one)."""

    def __init__(self, device: str, *, device_cache_rows: int | str = 0, deterministic: bool = False) -> None:
        torch.use_deterministic_algorithms(deterministic)
        self.ctx = init_distributed(TrainerConfig(device=device, backend="auto", nproc_per_node=1))
        torch.manual_seed(0)
        self.model = CTRModel(ModelConfig(dropout=0.0), num_dense=DENSE, num_fields=FIELDS, dim=DIM).to(self.ctx.device)
        self.opt = KStepAdam(self.model.named_parameters(), self.ctx, k=10, lr=1e-3)
        self.dir = tempfile.mkdtemp(dir=os.environ.get("TMPDIR"))
        self.store = open_shard(
            os.path.join(self.dir, "shard"),
            StoreConfig(embedding_dim=DIM, device_cache_rows=device_cache_rows),
            optimizer=OptimConfig().sparse_optimizer,
            device=self.ctx.device,
        )
        self.sparse = ShardedEmbedding(self.store, self.ctx, lr=0.02)
        self.model.train()

    def step(self, batch: Batch, step: int, precision: str = "fp32", check_loss: bool = False) -> torch.Tensor:
        loss = train_step(
            self.model,
            self.sparse,
            self.opt,
            batch,
            step=step,
            precision=Precision(precision, self.ctx.device),
            check_loss=check_loss,
        )
        self.opt.maybe_merge(step)
        return loss

    def close(self) -> None:
        self.store.close()
        torch.use_deterministic_algorithms(False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _where(filename: str, line: int) -> str:
    p = Path(filename)
    return f"{p.relative_to(REPO) if p.is_relative_to(REPO) else '/'.join(p.parts[-3:])}:{line}"


# ------------------------------------------------------------------------------------------------ sections
def section_world(device: str) -> dict[str, Any]:
    gpus = visible_gpus()
    out: dict[str, Any] = {"visible_gpus": gpus, "auto": resolve_world(TrainerConfig(device=device)).nproc_per_node}
    try:
        resolve_world(TrainerConfig(nproc_per_node=max(2, gpus + 1), backend="nccl", device="cuda"), gpus=gpus)
        out["too_many_nccl_ranks"] = "accepted (a bug)"
    except ValueError as exc:
        out["too_many_nccl_ranks"] = f"refused: {exc}"[:300]
    return out


def section_nccl(device: str) -> dict[str, Any]:
    """A one-rank NCCL group through the collectives of trainer.distributed (a smoke test of their arguments)."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, device_id=dev)
    try:
        send = torch.tensor([5], dtype=torch.int64, device=dev)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        x = torch.randn(5, DIM, device=dev)
        y = torch.empty_like(x)
        dist.all_to_all_single(y, x, output_split_sizes=[5], input_split_sizes=[5])
        objs: list[Any] = [None]
        dist.all_gather_object(objs, {"rank": 0})
        group = dist.new_group([0])
        t = torch.ones(3, device=dev)
        dist.reduce(t, dst=0, group=group)
        dist.all_reduce(t, group=group)
        dist.broadcast(t, src=0, group=group)
        torch.cuda.synchronize()
        return {
            "counts": recv.tolist(),
            "rows_ok": bool(torch.equal(x, y)),
            "objects_ok": objs == [{"rank": 0}],
            "two_phase_ok": bool(torch.equal(t, torch.ones(3, device=dev))),
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
        }
    finally:
        dist.destroy_process_group()


def section_host_reads(device: str) -> dict[str, Any]:
    out = {}
    for label, rows in (("host_store", 0), ("cuda_default", "auto")):
        rank = Rank(device, device_cache_rows=rows)
        bs = batches(6, seed=1)
        for i in range(5):
            rank.step(bs[i], i + 1)
        sync(rank.ctx.device)
        cuda = rank.ctx.device.type == "cuda"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                rank.step(bs[5], 6)
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        sync(rank.ctx.device)
        syncs = collections.Counter(_where(w.filename, w.lineno) for w in caught if "synchroniz" in str(w.message))
        out[label] = {
            "cuda_syncs": sum(syncs.values()) if cuda else "n/a (CPU)",
            "sync_sites": dict(syncs.most_common()),
        }
        rank.close()
    return out


def section_sync_free_step(device: str) -> dict[str, Any]:
    """Steps between log points (`check_loss=False`) of the CUDA default under `set_sync_debug_mode("error")`: a
    synchronisation raises; the error names the project line that made it.  On CPU the same steps, unchecked."""
    rank = Rank(device, device_cache_rows="auto")
    cuda = rank.ctx.device.type == "cuda"
    try:
        bs = batches(8, batch=256, seed=6)
        for i in range(5):
            rank.step(bs[i], i + 1, check_loss=True)
        sync(rank.ctx.device)
        if cuda:
            torch.cuda.set_sync_debug_mode("error")
        try:
            for i in range(5, 8):
                rank.step(bs[i], i + 1)
        except RuntimeError as exc:
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(REPO))]
            where = _where(frames[-1].filename, frames[-1].lineno or 0) if frames else "?"
            raise RuntimeError(f"a step synchronised at {where}: {str(exc).splitlines()[0]}") from exc
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
        sync(rank.ctx.device)
        rank.sparse.check_updates()  # the deferred finiteness check, read here as a log step would
        device_tier = rank.store.stats().get("device", {}).get("capacity")
        return {"steps": 3, "sync_debug": "error" if cuda else "n/a (CPU)", "device_tier_rows": device_tier}
    finally:
        rank.close()


def section_phases(device: str) -> dict[str, Any]:
    out = {}
    for dev in dict.fromkeys((device, "cpu")):
        rank = Rank(dev)
        bs = batches(12, seed=2)
        acc: dict[str, float] = collections.defaultdict(float)
        d = rank.ctx.device
        for i, b in enumerate(bs):
            t = [time.perf_counter()]
            cells = expand_cells(b.keys, ())
            pulled = rank.sparse.pull(cells.keys)
            rows = pulled.rows.requires_grad_(True)
            sync(d)
            t.append(time.perf_counter())
            loss = F.binary_cross_entropy_with_logits(
                rank.model(b.dense.to(d), pool_rows(rows, cells, "mean")), b.labels.to(d)
            )
            sync(d)
            t.append(time.perf_counter())
            rank.opt.zero_grad()
            loss.backward()
            sync(d)
            t.append(time.perf_counter())
            rank.sparse.push(pulled, rows.grad)
            sync(d)
            t.append(time.perf_counter())
            rank.opt.step()
            sync(d)
            t.append(time.perf_counter())
            if i >= 4:
                for name, a, z in zip(("pull", "forward", "backward", "push", "dense_adam"), t, t[1:], strict=False):
                    acc[name] += (z - a) * 1000 / (len(bs) - 4)
        out[dev] = {k: round(v, 2) for k, v in acc.items()}
        rank.close()
    return out


def section_throughput(device: str, steps: int = 40) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bs = batches(steps, seed=3)
    legs = [(device, 0, "fp32"), (device, 0, "bf16"), (device, "auto", "bf16"), ("cpu", 0, "fp32")]
    for dev, rows, prec in dict.fromkeys(legs):
        rank = Rank(dev, device_cache_rows=rows)
        for i in range(3):
            rank.step(bs[i], i + 1, prec)
        sync(rank.ctx.device)
        t0 = time.perf_counter()
        for i in range(3, steps):
            rank.step(bs[i], i + 1, prec)
        sync(rank.ctx.device)
        dt = time.perf_counter() - t0
        out[f"{dev}{'+device_cache' if rows else ''} {prec}"] = {
            "examples_per_s": round((steps - 3) * len(bs[0]) / dt, 1),
            "ms_per_step": round(dt * 1000 / (steps - 3), 2),
        }
        rank.close()
    return out


def section_determinism(device: str, steps: int = 12) -> dict[str, Any]:
    bs = batches(steps, seed=4)
    out = {}
    for deterministic in (False, True):
        runs = []
        for _ in range(2):
            rank = Rank(device, deterministic=deterministic)
            losses = [float(rank.step(b, i + 1, check_loss=True)) for i, b in enumerate(bs)]
            url = os.path.join(rank.dir, "s.parquet")
            rank.store.snapshot(url)
            snap = read_snapshot(url)
            keys, emb = snap.keys, snap.emb
            order = np.argsort(keys, kind="stable")
            runs.append((losses, [p.detach().cpu().clone() for p in rank.model.parameters()], emb[order]))
            rank.close()
        (l1, p1, e1), (l2, p2, e2) = runs
        out["deterministic" if deterministic else "default"] = {
            "losses_equal": l1 == l2,
            "dense_bitwise_equal": all(torch.equal(a, b) for a, b in zip(p1, p2, strict=True)),
            "rows_bitwise_equal": bool(np.array_equal(e1, e2)),
            "max_row_diff": float(np.abs(e1 - e2).max()) if e1.shape == e2.shape else None,
        }
    return out


def section_restore_memory(device: str) -> dict[str, Any]:
    """Peak device memory while a device cache restores: the buffer is reused, not allocated twice."""
    rows = 500_000
    rank = Rank(device, device_cache_rows=rows)
    for i, b in enumerate(batches(3, seed=5)):
        rank.step(b, i + 1)
    url = os.path.join(rank.dir, "s.parquet")
    rank.store.snapshot(url)
    dev = rank.ctx.device
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    rank.store.restore(url)
    torch.cuda.synchronize(dev)
    buffer = rows * (12 * DIM + 8)
    peak = torch.cuda.max_memory_allocated(dev) - base
    rank.close()
    return {"buffer_bytes": buffer, "restore_peak_extra_bytes": int(peak), "second_buffer": peak >= buffer}


SECTIONS: dict[str, tuple[Callable[[str], dict[str, Any]], bool]] = {
    "world": (section_world, False),
    "nccl": (section_nccl, True),
    "host_reads": (section_host_reads, False),
    "sync_free_step": (section_sync_free_step, False),
    "phases": (section_phases, False),
    "throughput": (section_throughput, False),
    "determinism": (section_determinism, False),
    "restore_memory": (section_restore_memory, True),
}
"""name -> (function of the device, needs CUDA)."""
SMOKE_SECTIONS = ("world", "nccl", "sync_free_step", "phases", "restore_memory")
"""The sections `--smoke` runs on CPU: every kind (CUDA-only ones report skipped), none of the long ones."""


def run_probe(
    device: str, out: str, *, sections: list[str] | None = None, deadline: float | None = None
) -> dict[str, Any]:
    """Run the sections in order, writing `out` (JSON) after each; a section's error is reported, not raised."""
    res: dict[str, Any] = {
        "device": device,
        "cuda_available": torch.cuda.is_available(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    for name in sections or list(SECTIONS):
        fn, needs_cuda = SECTIONS[name]
        t0 = time.time()
        if needs_cuda and (device != "cuda" or not torch.cuda.is_available()):
            res[name] = {"status": "skipped: no CUDA"}
        elif deadline is not None and time.time() > deadline:
            res[name] = {"status": "skipped: time budget"}
        else:
            try:
                res[name] = {"status": "ok", **fn(device)}
            except Exception as exc:  # a probe reports what broke and goes on
                traceback.print_exc()
                res[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:1500]}
        res[name]["seconds"] = round(time.time() - t0, 2)
        print(f"[probe] {name}: {json.dumps(res[name], default=str)[:800]}", flush=True)
        Path(out).write_text(json.dumps(res, indent=1, default=str))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="the probe's JSON (default: bench/results or $BENCH_RESULTS_DIR)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {list(SECTIONS)}")
    ap.add_argument("--budget-s", type=float, default=0, help="skip the sections that would start after this (0: none)")
    add_smoke(ap)
    args = apply_smoke(ap.parse_args(argv), {"device": "cpu", "sections": ",".join(SMOKE_SECTIONS)})
    if args.out is None:
        results_dir().mkdir(parents=True, exist_ok=True)
        args.out = str(results_dir() / "gpu_probe.json")
    torch.set_num_threads(1)  # what a rank runs with (OMP_NUM_THREADS=1)
    deadline = time.time() + args.budget_s if args.budget_s else None
    res = run_probe(args.device, args.out, sections=args.sections.split(","), deadline=deadline)
    bad = [n for n, r in res.items() if isinstance(r, dict) and r.get("status") == "error"]
    if args.device == "cuda":
        bad += [n for n, r in res.items() if isinstance(r, dict) and str(r.get("status", "")).startswith("skipped")]
    if bad:
        print(f"[probe] not passed: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
