"""Training throughput and MFU of the default model: our trainer at 1, 2, 4 processes beside a plain PyTorch loop and
TorchRec.

    python -m bench.train [--rows 100000] [--batch N] [--procs 1,2,4] [--repeat 1] [--smoke]

Model and optimisation: the defaults a daily run trains with: `model` and `store` of
`flows.config.RunConfig()`, and the `optim` values `trainer.plan.recipe.derive` gives for `--rows`
train rows on N ranks (batch size, epochs, learning rates, dropout, the cross term's lr scale, the wide
term's own loss, `trainer.step.ctr_loss`);
`--batch` overrides the recipe's batch.  The plain loop and TorchRec train the same model with the
1-rank recipe's values.

MFU: column `mfu` = FLOPs per example (forward + backward, counted by `bench._mfu` on the model at the
recipe's batch) x examples/s per process / the fp32 matmul rate one thread attains on the model's widest
layer (`batch x 624 x 624` by default), measured in this run before and after the rows (the better
reading).  `--smoke`: 1,000 rows on 1 process (seconds; checks it runs).

Data: synthetic Criteo-shaped rows (26 categorical + 13 integer fields,
`pipeline.generate`) encoded into a features directory (`pipeline.encode.frame.encode_frame`).

Rows measured, all on CPU with one thread per process:

- `ours wN`: `trainer.launch.torchrun.run_training` (torchrun, gloo) with N ranks, the
  table in the tiered store (host memory over SSD); examples/s over the
  training loop (`train_s` of model.json: process start-up excluded);
- `ours w1 prefetch=2` / `ours w2 prefetch=2`: the same with the reader thread
  two batches ahead (`trainer.prefetch_batches=2`), i.e. the gain of pipelining:
  the default `prefetch_batches="auto"` runs without the thread on CPU
  (`trainer.data.prefetch_depth`);
- `ours w2 stale=S`: the HET cache with staleness bound S; its sparse bytes per
  step beside those of `ours w2` (bound 0);
- column `bf16_examples_per_s` of `ours wN`: the same run with `trainer.precision=bf16` (bfloat16
  autocast of the dense network, on CPU here; float32 elsewhere), and `bf16_vs_fp32` its ratio to
  the row's fp32 examples/s (`--no-bf16` leaves it out);
- `plain torch`: one process, the same CTRModel on `nn.EmbeddingBag(sparse=True)`
  per field (indices pre-mapped, every batch already in memory), SparseAdam for
  the tables, Adam for the rest: the reference a single process should match;
- `plain torch fresh` / `torchrec EBC fresh`: the same loops in a fresh process
  started with our ranks' glibc malloc settings (`trainer.main.tune_malloc`), the
  like-for-like references: the in-process loops run in a heap this process has
  already grown;
- `torchrec EBC`: TorchRec's `EmbeddingBagCollection` on CPU with the same
  model on top, when `torchrec` is installed (the `bench` extra); otherwise the
  row says it was skipped.
- `reader alone wN`: rank 0's share of N ranks read and decoded into batches by
  `trainer.data.RankReader` with nothing else running (no pulls, no compute), in
  this process; `vs_rank_step` is its examples/s over one rank of `ours wN`
  (examples/s / N): above 1, reading cannot be what bounds a training step.

On a shared machine the load drifts between runs that take half a minute each, so
one pass compares runs made under different loads.  `--repeat R` makes R passes
(each pass runs every row once, the references first in every other pass) and
reports per row the median examples/s and the median (min..max) over the passes
of its ratio to the plain loop of the same pass.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench._common import add_smoke, apply_smoke, report, train_spec
from bench._mfu import mfu, model_mfu
from pipeline.schema import LogSchema
from storage.embedding.config import StoreConfig
from trainer.config import OptimConfig
from trainer.launch.torchrun import run_training
from trainer.malloc import MMAP_THRESHOLD, TRIM_THRESHOLD
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CROSS_PREFIX, CTRModel
from trainer.plan.recipe import Recipe, derive
from trainer.step import ctr_loss

SMOKE = {"rows": 1000, "procs": "1", "staleness": 0, "bf16": False, "repeat": 1}
"""`--smoke`: one rank, 1,000 rows (the recipe: 3 passes of 4 steps), no bf16, prefetch or staleness rows."""


def default_model() -> tuple[ModelConfig, StoreConfig]:
    """The model and store sections of a default run (`flows.config.RunConfig`): what a day trains."""
    from flows.config import RunConfig

    cfg = RunConfig()
    return cfg.model, cfg.store


def recipe_for(model: ModelConfig, rows: int, world_size: int, batch: int | None) -> Recipe:
    """The day's recipe for `rows` train rows on `world_size` ranks (the batch set when `batch` is given)."""
    return derive(OptimConfig(batch_size=batch) if batch else OptimConfig(), model, rows=rows, world_size=world_size)


def events_frame(table: pa.Table, schema: LogSchema) -> pd.DataFrame:
    """A generated day (`pipeline.generate.generate_day`: label, I1..I13, C1..C26) as the events rows ingest
    writes (`LogSchema.events_schema`): no timestamp (Criteo has none), `order` the line number, dense float32."""
    columns = {
        "label": table.column("label").cast(pa.int8()),
        "ts": pa.nulls(len(table), pa.int64()),
        "order": pa.array(np.arange(len(table), dtype=np.int64)),
    }
    columns |= {name: table.column(name).cast(pa.float32()) for name in schema.dense}
    columns |= {name: table.column(name) for name in schema.categorical}
    return pa.table(columns, schema=schema.events_schema()).to_pandas()


def write_synthetic_features(root: Path, rows: int, *, eval_rows: int, seed: int = 0) -> Path:
    """Generate one synthetic Criteo day, admit keys seen twice, encode and commit `root` (train/eval splits)."""
    from pipeline.encode.frame import dense_columns, encode_frame, key_columns
    from pipeline.encode.keys import feature_keys
    from pipeline.generate import generate_day
    from pipeline.schema import get_schema
    from storage.features_manifest import FeaturesManifest

    schema = get_schema("criteo")
    table, _ = generate_day(0, rows + eval_rows, seed=seed)
    events = events_frame(table, schema)
    keys = np.concatenate([feature_keys(j, events[c]) for j, c in enumerate(schema.categorical)])
    uniq, counts = np.unique(keys, return_counts=True)
    features = encode_frame(events, schema, uniq[counts >= 2])
    for split, frame in (("train", features.iloc[:rows]), ("eval", features.iloc[rows:])):
        (root / split).mkdir(parents=True)
        pq.write_table(
            pa.Table.from_pandas(frame, preserve_index=False), root / split / "part-00000.parquet", row_group_size=16384
        )
    manifest = FeaturesManifest(
        rows_train=rows,
        rows_eval=eval_rows,
        dense_columns=tuple(dense_columns(schema)),
        key_columns=tuple(key_columns(schema)),
        fields=tuple(schema.categorical),
    )
    (root / "_SUCCESS.json").write_text(json.dumps(manifest.to_dict()))
    return root


def run_ours(tmp: Path, features: Path, tag: str, store: StoreConfig, model: ModelConfig, **kw: Any) -> dict[str, Any]:
    spec = train_spec(
        features,
        tmp / "runs" / tag / "model",
        tmp / "local" / tag,
        store=store,
        model=model,
        run_tag=tag,
        backend="gloo",
        device="cpu",
        timeout_s=1800,
        log_every=10_000,
        checkpoint_every=0,
        **kw,
    )
    res = run_training(spec, work_dir=str(tmp / "work"))
    return {
        "examples_per_s": res.train.examples_per_s,
        "steps": res.train.steps,
        "train_s": res.train.train_s,
        "final_loss": res.train.final_loss,
        "sparse_MB_per_step": res.train.stats["sparse_bytes_per_step"] / 2**20,
        "wall_s": res.wall_s,
    }


def run_reader(features: Path, *, batch: int, world_size: int) -> dict[str, Any]:
    """Rank 0's batches of `world_size` ranks, read and decoded with no training: the reader's own rate."""
    from trainer.data import RankReader, read_schema, split_dir

    url = str(features)
    reader = RankReader(split_dir(url, "train"), read_schema(url), rank=0, world_size=world_size, batch_size=batch)
    t0 = time.perf_counter()
    rows = sum(len(b.labels) for b in reader.iter_batches())
    read_s = time.perf_counter() - t0
    return {"examples_per_s": rows / read_s, "steps": reader.steps_per_epoch, "train_s": read_s}


def _load_arrays(features: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t = pq.read_table(features / "train")
    dense = np.stack([t.column(f"d_{i}").to_numpy() for i in range(13)], 1).astype(np.float32)
    keys = np.stack([t.column(f"k_{j}").to_numpy() for j in range(26)], 1)
    return t.column("label").to_numpy().astype(np.float32), dense, keys


def _per_field_indices(keys: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Keys (N, F) -> dense per-field indices (N, F) and each field's table size: the peers' pre-mapped inputs."""
    idx = np.empty_like(keys)
    sizes = []
    for f in range(keys.shape[1]):
        uniq, inv = np.unique(keys[:, f], return_inverse=True)
        idx[:, f] = inv
        sizes.append(len(uniq))
    return idx, sizes


def dense_groups(model: CTRModel, lr: float, cross_lr_scale: float) -> list[dict[str, Any]]:
    """Adam parameter groups as the trainer makes them: the cross term at `lr * cross_lr_scale`, the rest at `lr`
    (a scale of 0 still runs the term's forward, backward and moments, as the trainer does)."""
    named = list(model.named_parameters())
    cross = [p for n, p in named if n.startswith(CROSS_PREFIX)]
    rest = [p for n, p in named if not n.startswith(CROSS_PREFIX)]
    return [{"params": rest, "lr": lr}, *([{"params": cross, "lr": lr * cross_lr_scale}] if cross else [])]


def run_plain(
    features: Path,
    *,
    batch: int,
    dim: int,
    lr: float,
    sparse_lr: float,
    steps: int,
    config: dict[str, Any] | None = None,
    cross_lr_scale: float = 1.0,
    wide_loss: float = 0.0,
) -> dict[str, Any]:
    """One process: EmbeddingBag(sparse=True) per field + SparseAdam, the same CTRModel + Adam.

    `config`: the `model` fields (`ModelConfig` keys; default: the default model with dropout 0).
    """
    labels, dense, keys = _load_arrays(features)
    idx, sizes = _per_field_indices(keys)
    torch.manual_seed(0)
    bags = torch.nn.ModuleList(torch.nn.EmbeddingBag(n, dim, mode="sum", sparse=True) for n in sizes)
    for b in bags:
        torch.nn.init.normal_(b.weight, std=0.01)
    model = CTRModel(model_config(config), num_dense=13, num_fields=26, dim=dim)
    opt_s = torch.optim.SparseAdam(list(bags.parameters()), lr=sparse_lr)
    opt_d = torch.optim.Adam(dense_groups(model, lr, cross_lr_scale), lr=lr)
    L, D, I = torch.from_numpy(labels), torch.from_numpy(dense), torch.from_numpy(idx)
    offsets = torch.arange(batch)
    n = len(labels) // batch
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for s in range(steps):
        lo = (s % n) * batch
        ids = I[lo : lo + batch]
        emb = torch.stack([bags[f](ids[:, f], offsets) for f in range(26)], 1)  # (B, F, D)
        loss, objective = ctr_loss(model, D[lo : lo + batch], emb, L[lo : lo + batch], wide_loss=wide_loss)
        opt_s.zero_grad()
        opt_d.zero_grad()
        objective.backward()
        opt_s.step()
        opt_d.step()
    train_s = time.perf_counter() - t0
    return {
        "examples_per_s": steps * batch / train_s,
        "steps": steps,
        "train_s": train_s,
        "final_loss": float(loss.detach()),
    }


def model_config(fields: dict[str, Any] | None) -> ModelConfig:
    """A `ModelConfig` from its fields as JSON carries them to a fresh process (None: the default, dropout 0)."""
    fields = {"dropout": 0.0, **(fields or {})}
    if "mlp_dims" in fields:
        fields["mlp_dims"] = tuple(fields["mlp_dims"])
    return ModelConfig(**fields)


def model_fields(model: ModelConfig) -> dict[str, Any]:
    """The fields of `model` for `run_plain(config=...)` / `run_torchrec(config=...)` (JSON-able)."""
    return {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}


RANK_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}
"""The glibc settings our ranks apply at start (`trainer.malloc.tune_malloc`), as environment
variables, for the like-for-like `fresh` reference rows."""


def run_fresh(fn: str, features: Path, **kw: Any) -> dict[str, Any] | str:
    """Reference `fn` (`run_plain` or `run_torchrec`) in a fresh process with our ranks' malloc settings.

    Why: the in-process references run in this long-lived process, whose heap earlier work has already
    grown, so they take few page faults per step by chance; a fresh process does not (see `tune_malloc`).
    These rows give a reference the same start as a rank, so `ours w1` against them measures the
    training step, not the malloc settings.
    """
    code = (
        f"import json, sys, torch; from pathlib import Path; from bench.train import {fn}; "
        f"torch.set_num_threads(1); print(json.dumps({fn}(Path(sys.argv[1]), **json.loads(sys.argv[2]))))"
    )
    env = {**os.environ, **RANK_MALLOC_ENV, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(features), json.dumps(kw)],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{fn} in a fresh process failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_torchrec(
    features: Path,
    *,
    batch: int,
    dim: int,
    lr: float,
    steps: int,
    config: dict[str, Any] | None = None,
    cross_lr_scale: float = 1.0,
    wide_loss: float = 0.0,
    **_: Any,
) -> dict[str, Any] | str:
    """TorchRec's EmbeddingBagCollection under the same CTRModel, or a line saying why it was skipped."""
    try:
        from torchrec import (
            EmbeddingBagCollection,
            EmbeddingBagConfig,
            KeyedJaggedTensor,
        )
    except Exception as exc:  # not installed, or its fbgemm does not load
        return f"skipped: torchrec not importable ({type(exc).__name__}: {exc}); install the `bench` extra"
    labels, dense, keys = _load_arrays(features)
    idx, sizes = _per_field_indices(keys)
    tables = [
        EmbeddingBagConfig(name=f"t{f}", embedding_dim=dim, num_embeddings=n, feature_names=[f"f{f}"])
        for f, n in enumerate(sizes)
    ]
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    model = CTRModel(model_config(config), num_dense=13, num_fields=26, dim=dim)
    # unsharded EBC weights get dense gradients: plain Adam over everything (TorchRec's fused sparse
    # optimizers need DistributedModelParallel sharding)
    opt = torch.optim.Adam(
        [{"params": list(ebc.parameters()), "lr": lr}, *dense_groups(model, lr, cross_lr_scale)], lr=lr
    )
    L, D, I = torch.from_numpy(labels), torch.from_numpy(dense), torch.from_numpy(idx)
    names = [f"f{f}" for f in range(26)]
    lengths = torch.ones(26 * batch, dtype=torch.int32)
    n = len(labels) // batch
    t0 = time.perf_counter()
    loss = torch.zeros(())
    for s in range(steps):
        lo = (s % n) * batch
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=names, values=I[lo : lo + batch].T.reshape(-1), lengths=lengths)
        pooled = ebc(kjt)
        emb = torch.stack([pooled[k] for k in names], 1)  # (B, F, D)
        loss, objective = ctr_loss(model, D[lo : lo + batch], emb, L[lo : lo + batch], wide_loss=wide_loss)
        opt.zero_grad()
        objective.backward()
        opt.step()
    train_s = time.perf_counter() - t0
    return {
        "examples_per_s": steps * batch / train_s,
        "steps": steps,
        "train_s": train_s,
        "final_loss": float(loss.detach()),
    }


def run_pass(
    tmp: Path,
    features: Path,
    store: StoreConfig,
    model: ModelConfig,
    args: argparse.Namespace,
    *,
    suffix: str,
    refs_first: bool,
) -> dict[str, dict[str, Any] | str]:
    """Every row once (a tag `suffix` keeps this pass's model and SSD directories apart): name -> result.

    `ours wN` trains with the recipe for N ranks (every `optim` value derived, `--batch` aside); the references
    run the 1-rank recipe's steps (one rank's passes over the rows, the last batch of a pass partial)."""
    common: dict[str, Any] = {"batch_size": args.batch} if args.batch else {}
    procs = [int(x) for x in args.procs.split(",")]
    out: dict[str, dict[str, Any] | str] = {}

    def refs() -> None:
        r = recipe_for(model, args.rows, 1, args.batch)
        kw = {
            "batch": r.optim.batch_size,
            "dim": store.embedding_dim,
            "lr": r.optim.lr,
            "sparse_lr": r.optim.sparse_lr,
            "steps": r.steps,
            "config": model_fields(r.model),
            "cross_lr_scale": r.optim.cross_lr_scale,
            "wide_loss": r.optim.wide_loss,
        }
        out["plain torch"] = run_plain(features, **kw)
        out["plain torch fresh"] = run_fresh("run_plain", features, **kw)
        out["torchrec EBC"] = trec = run_torchrec(features, **kw)
        # not importable here is not importable in a fresh process of the same interpreter either
        out["torchrec EBC fresh"] = trec if isinstance(trec, str) else run_fresh("run_torchrec", features, **kw)

    if refs_first:
        refs()
    for n in procs:
        out[f"reader alone w{n}"] = run_reader(
            features, batch=recipe_for(model, args.rows, n, args.batch).optim.batch_size, world_size=n
        )
        out[f"ours w{n}"] = run_ours(tmp, features, f"w{n}{suffix}", store, model, nproc_per_node=n, **common)
        if args.bf16:
            bf16 = run_ours(
                tmp, features, f"w{n}bf{suffix}", store, model, nproc_per_node=n, precision="bf16", **common
            )
            out[f"ours w{n}"]["bf16_examples_per_s"] = bf16["examples_per_s"]
        if n in (1, 2) and not args.smoke:  # the default ("auto") runs without the reader thread on CPU: measure it
            out[f"ours w{n} prefetch=2"] = run_ours(
                tmp, features, f"w{n}pf{suffix}", store, model, nproc_per_node=n, prefetch_batches=2, **common
            )
        if n == 2 and args.staleness:
            out[f"ours w2 stale={args.staleness}"] = run_ours(
                tmp, features, f"w2s{suffix}", store, model, nproc_per_node=2, staleness_bound=args.staleness, **common
            )
    if not refs_first:
        refs()
    return out


def summarise(passes: list[dict[str, dict[str, Any] | str]]) -> list[dict[str, Any]]:
    """One row per run: the median pass's numbers, `vs_plain` = the median over passes of the ratio to the
    plain loop of the same pass (with its min..max when there are several passes)."""
    refs = ["plain torch", "plain torch fresh", "torchrec EBC", "torchrec EBC fresh"]
    names = [n for n in passes[0] if n.startswith(("ours", "reader"))] + refs
    rows: list[dict[str, Any]] = []
    for name in names:
        got = [p[name] for p in passes]
        if any(isinstance(g, str) for g in got):
            rows.append({"run": name, "note": next(g for g in got if isinstance(g, str))})
            continue
        ratios = [g["examples_per_s"] / p["plain torch"]["examples_per_s"] for g, p in zip(got, passes, strict=True)]
        mid = sorted(range(len(got)), key=lambda i: got[i]["examples_per_s"])[len(got) // 2]
        row = {
            "run": name,
            **got[mid],
            "examples_per_s": float(np.median([g["examples_per_s"] for g in got])),
            "vs_plain": float(np.median(ratios)),
        }
        if name.startswith("reader alone w"):  # against one rank of the trainer with the same share
            n = int(name.removeprefix("reader alone w"))
            rank_rates = [
                p[f"ours w{n}"]["examples_per_s"] / n for p in passes if isinstance(p.get(f"ours w{n}"), dict)
            ]
            row["vs_rank_step"] = row["examples_per_s"] / float(np.median(rank_rates))
            del row["vs_plain"]  # reading alone is not a training loop
        elif len(passes) > 1:
            row["vs_plain_range"] = f"{min(ratios):.3f}..{max(ratios):.3f}"
            row["vs_plain_passes"] = ratios
        if "bf16_examples_per_s" in row:
            row["bf16_examples_per_s"] = float(np.median([g["bf16_examples_per_s"] for g in got]))
            row["bf16_vs_fp32"] = row["bf16_examples_per_s"] / row["examples_per_s"]
        rows.append(row)
    return rows


def add_mfu(rows: list[dict[str, Any]], flops: dict[str, Any]) -> None:
    """Column `mfu` of every training row: its examples/s per process x FLOPs per example / the attainable rate."""
    for row in rows:
        if "examples_per_s" not in row or row["run"].startswith("reader"):
            continue
        n = int(row["run"].split()[1].removeprefix("w")) if row["run"].startswith("ours w") else 1
        row["mfu"] = mfu(row["examples_per_s"] / n, flops["flops_per_example"], flops["attainable_gflops"])


def probe_flops(model: ModelConfig, store: StoreConfig, batch: int) -> dict[str, Any]:
    """FLOPs per example and the attainable matmul rate of the model at `batch` (`bench._mfu`), in this process."""
    torch.manual_seed(0)
    net = CTRModel(model, num_dense=13, num_fields=26, dim=store.embedding_dim)
    return model_mfu(net, torch.randn(batch, 13), torch.randn(batch, 26, store.embedding_dim))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.train", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=None, help="examples per step per rank (default: the recipe's)")
    p.add_argument("--procs", default="1,2,4")
    p.add_argument("--staleness", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1, help="passes over every row (medians; see the module docstring)")
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="skip the bf16 run of each `ours wN` row")
    add_smoke(p)
    args = apply_smoke(p.parse_args(argv), SMOKE)
    if args.repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {args.repeat}")
    torch.set_num_threads(1)
    model, store = default_model()
    store = dataclasses.replace(store, host_budget_mb=512)
    recipe = recipe_for(model, args.rows, 1, args.batch)
    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        batch = int(recipe.optim.batch_size)
        flops = probe_flops(recipe.model, store, batch)
        features = write_synthetic_features(tmp / "features", args.rows, eval_rows=1000)
        passes = [
            run_pass(tmp, features, store, model, args, suffix=f"-{r}" if r else "", refs_first=r % 2 == 1)
            for r in range(args.repeat)
        ]
        after = probe_flops(recipe.model, store, batch)["attainable_gflops"]
        flops["attainable_gflops_readings"] = [flops["attainable_gflops"], after]
        flops["attainable_gflops"] = max(flops["attainable_gflops"], after)
        rows = summarise(passes)
        add_mfu(rows, flops)
        trec = passes[0]["torchrec EBC"]
        notes = (
            "examples/s over the training loop only; every process runs 1 torch thread "
            f"({os.cpu_count()} CPUs here); the plain and TorchRec loops have every batch in "
            "memory with pre-mapped indices, ours reads Parquet and keeps the table in the tiered store.\n"
            f"model: the default ({flops['flops_per_example'] / 1e6:.2f} MFLOP/example forward+backward); "
            f"{recipe.summary()}; mfu = examples/s per process x FLOPs/example / "
            f"{flops['attainable_gflops']:.1f} GFLOP/s (fp32 matmul {flops['matmul_shape']}, 1 thread, this run)."
        )
        if args.repeat > 1:
            notes += (
                f"\n{args.repeat} passes (references first in every other one): median examples/s; vs_plain is "
                "the median (vs_plain_range min..max) of the ratio to the plain loop of the same pass."
            )
        if isinstance(trec, str):
            notes += f"\nTorchRec: {trec}"
        report(
            "train",
            rows,
            params={
                "rows": args.rows,
                "batch": batch,
                "dim": store.embedding_dim,
                "model": str(recipe.model),
                "recipe": recipe.record(),
                "staleness": args.staleness,
                "repeat": args.repeat,
                "smoke": args.smoke,
                **flops,
            },
            notes=notes,
            columns=[
                "run",
                "examples_per_s",
                "vs_plain",
                *(["vs_plain_range"] if args.repeat > 1 else []),
                "mfu",
                "vs_rank_step",
                "bf16_examples_per_s",
                "bf16_vs_fp32",
                "steps",
                "train_s",
                "final_loss",
                "sparse_MB_per_step",
                "note",
            ],
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
