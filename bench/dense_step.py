"""The dense step alone: the default model's forward + backward at the recipe's batch, its MFU, and the attention's
CPU kernels against autograd's plain formulation in the same run.

    python -m bench.dense_step [--rows 100000 900000] [--rounds 30] [--variants KEY=VALUE[,KEY=VALUE] ...] [--smoke]
    python -m bench.dense_step --build [--rounds 3]

`--build` compares how the compiled kernel is built, loaded and called: this project's ctypes build against torch's
`cpp_extension.load_inline`, in the same rounds (`bench._kernel_build`; results `kernel_build`).

For each day size (train rows of one rank) the recipe (`trainer.plan.recipe.derive`) gives the batch and the
model's dropout; the default model (`flows.config.RunConfig`) is built at that batch and runs forward + backward
on random inputs (the embedding rows a leaf that gets its gradient, as in training), one torch thread, with the
ranks' glibc malloc settings (`trainer.malloc.tune_malloc`: without them each step faults in its pages again).  Each
round times 3 steps with the attention's kernel as training runs it (the compiled one of
`trainer.models.attention_native` where a C compiler builds it), 3 with its torch-ops kernel (`torch_ops_kernel()`:
the same as the first where nothing builds) and 3 with autograd's plain formulation (`plain_formulation()`), in
alternating order, in CPU seconds of this process (a shared machine's other load does not count, its clock
changes do, hence the pairing); the table gives the medians and the median of the per-round ratios.  Each of
`--variants` (the default config with some keys set, e.g. `model.attention_input=tokens`) runs with the kernel in
the same rounds, against the default (`speedup_vs_default`).

MFU = FLOPs per example (counted, `bench._mfu`) x examples per CPU-second / the fp32 matmul rate one thread
attains on the model's widest layer at the same batch (the best of readings before and after the rounds).
`mfu` takes the median step, `mfu_best` the fastest round's: a shared host's load slows both the step and the
matmul reading, the step's memory-bound parts more (the same code read 0.56-0.66 within 30 minutes at batch 1,024,
docs/benchmarks.md), and the best against the best is the reading least moved by it.  This is the dense step's
MFU, the issue's measure: the product's whole train stage (rows pulled and pushed, batches read) is `bench.day`'s
and `bench.train`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from bench._common import Variant, add_smoke, apply_smoke, report
from bench._mfu import model_mfu
from bench.train import recipe_for
from flows.config import RunConfig, with_overrides
from storage.embedding.config import StoreConfig
from trainer.malloc import tune_malloc
from trainer.models.attention_cpu import plain_formulation, torch_ops_kernel
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel

SMOKE = {"rows": [2_000], "rounds": 2, "variants": ["model.attention_input=tokens"]}
STEPS = 3
"""Steps per variant per round."""


def time_steps(step: Callable[[], None], mode: str) -> float:
    """CPU seconds per step over STEPS steps, the attention run by `mode`: "kernel" (the default path: the compiled
    kernel where it builds), "torch-ops" (the torch-ops kernel) or "plain" (autograd's plain formulation)."""
    context = {"plain": plain_formulation, "torch-ops": torch_ops_kernel, "kernel": contextlib.nullcontext}[mode]
    t0 = time.process_time()
    with context():
        for _ in range(STEPS):
            step()
    return (time.process_time() - t0) / STEPS


def model_step(model: ModelConfig, store: StoreConfig, rows: int) -> tuple[Callable[[], None], CTRModel, tuple, int]:
    """One dense step of `model` at the recipe's batch for `rows` rows of one rank: (step, net, inputs, batch)."""
    recipe = recipe_for(model, rows, 1, None)
    batch = int(recipe.optim.batch_size)
    torch.manual_seed(0)
    net = CTRModel(recipe.model, num_dense=13, num_fields=26, dim=store.embedding_dim).train()
    dense = torch.randn(batch, 13)
    emb = torch.randn(batch, 26, store.embedding_dim, requires_grad=True)
    labels = torch.randint(0, 2, (batch,)).float()

    def step() -> None:
        net.zero_grad(set_to_none=True)
        emb.grad = None
        F.binary_cross_entropy_with_logits(net(dense, emb), labels).backward()

    return step, net, (dense, emb), batch


def measure(rows: int, rounds: int, variants: tuple[Variant, ...] = ()) -> list[dict[str, Any]]:
    """The rows of one day size: the default model with the kernel, with the plain formulation, with the torch-ops
    kernel, and each variant (the default config with its keys set) with the kernel, all in the same rounds."""
    cfg = RunConfig()
    runs = [
        ("plain formulation (autograd)", cfg, "plain"),
        ("attention CPU kernel", cfg, "kernel"),
        ("attention torch-ops kernel", cfg, "torch-ops"),
    ]
    runs += [(f"attention CPU kernel [{v.label}]", with_overrides(cfg, v.sets), "kernel") for v in variants]
    steps = [model_step(c.model, c.store, rows) for _, c, _ in runs]
    flops = [model_mfu(net, *inputs) for _, net, inputs, _ in steps]
    for (step, *_), (_, _, mode) in zip(steps, runs, strict=True):  # warm-up: allocations, thread pool, the build
        time_steps(step, mode)
    times: list[list[float]] = [[] for _ in runs]
    order = list(range(len(runs)))
    for r in range(rounds):
        for i in order if r % 2 else order[::-1]:
            times[i].append(time_steps(steps[i][0], runs[i][2]))
    rate = max(max(f["attainable_gflops"] for f in flops), model_mfu(steps[1][1], *steps[1][2])["attainable_gflops"])
    out = []
    for i, (label, _, _) in enumerate(runs):
        batch = steps[i][3]
        per_step = statistics.median(times[i])
        out.append(
            {
                "run": f"{rows:,} rows: {label}",
                "rows": rows,
                "batch": batch,
                "ms_per_step": round(per_step * 1e3, 2),
                "examples_per_cpu_s": round(batch / per_step),
                "speedup_vs_plain": round(statistics.median(p / t for p, t in zip(times[0], times[i], strict=True)), 3),
                "speedup_vs_default": round(
                    statistics.median(d / t for d, t in zip(times[1], times[i], strict=True)), 3
                ),
                "mfu": round(flops[i]["flops_per_example"] * batch / per_step / (rate * 1e9), 3),
                "mfu_best": round(flops[i]["flops_per_example"] * batch / min(times[i]) / (rate * 1e9), 3),
                "mflop_per_example": round(flops[i]["flops_per_example"] / 1e6, 2),
                "attainable_gflops": round(rate, 1),
                "matmul_shape": flops[i]["matmul_shape"],
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.dense_step", description=__doc__.splitlines()[0])
    p.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[100_000, 900_000],
        help="train rows of one rank per day: the recipe's batch (100,000: 128; 900,000: 1024)",
    )
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument(
        "--variants",
        nargs="*",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="the default config with these keys set, timed with the kernel in the same rounds "
        "(e.g. model.attention_input=tokens)",
    )
    p.add_argument("--build", action="store_true", help="compare the kernel's ctypes build with load_inline instead")
    add_smoke(p)
    args = apply_smoke(p.parse_args(argv), SMOKE)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.build:
        from bench._kernel_build import measure as measure_build

        rounds = args.rounds if "--rounds" in (argv or sys.argv) else 3
        report(
            "kernel_build",
            measure_build(rounds),
            params={"rounds": rounds, "shape": "26 tokens, 2 heads x 8", "batches": [1, 128, 1024]},
            notes=f"medians over {rounds} alternating rounds on a shared machine; cold build: wall s and the compiler "
            "processes' CPU s in an empty cache; warm load: ms in a new process with the build cached; call_us_bN: "
            "CPU us per forward at batch N on preallocated tensors.",
        )
        return
    torch.set_num_threads(1)
    malloc = tune_malloc()  # as a rank does at start (trainer.main)
    variants = tuple(Variant.parse(v) for v in args.variants)
    rows = [row for n in args.rows for row in measure(n, args.rounds, variants)]
    report(
        "dense_step",
        rows,
        params={
            "rows": args.rows,
            "rounds": args.rounds,
            "steps_per_round": STEPS,
            "variants": args.variants,
            "malloc": [list(m) for m in malloc],
        },
        notes=f"medians over {args.rounds} rounds of {STEPS} steps each, CPU seconds, 1 torch thread; "
        "speedup_vs_plain: the median of the per-round ratios; mfu: counted FLOPs x examples per CPU-second "
        "/ the attained fp32 matmul rate (matmul_shape, 1 thread, this run); mfu_best: of the fastest round.",
    )


if __name__ == "__main__":
    main()
