"""What a step of `Trainer.train` would wait for on CUDA, counted by kind, per step, for each store configuration.

A device-to-host copy or a read of a device value on the host (`.item()`, `bool()`, a data-dependent shape)
makes a CUDA rank wait for the GPU.  On CPU nothing waits, so the ranks here run as a CUDA rank places its
tensors: their training device (and, as under NCCL, their communication device) is `SIM_DEVICE`, and
`tests.helpers.host_reads.TransferMode` (its docstring gives the design) counts every copy from that device to
the host and every host read of a device value, by (path, function, op), step by step.  Each step that neither
logs nor checkpoints must make exactly the transfers `EXPECTED` lists for its configuration, each named in
`WHY`: counts are compared, not sets, so one more copy inside a known function fails too.

- `CUDA default`: `store.device_cache_rows: auto`, which on CUDA is the device tier over the host tier
  (`storage.embedding.tiered.device_cache_rows`; sized here as it would be with a GPU's 80 GiB free).  One rank:
  nothing at all, the row gradients stay on the device and the tier's finiteness check is read at log steps
  (`CachingTier.check_updates`).  Before this configuration was the default, CUDA ran the host store's.
- `host store`: `store.device_cache_rows: 0`: every push copies the row gradients to the host store and
  waits for the copy.
- Two ranks add what the all-to-alls cost under NCCL in either configuration: the split sizes read once
  per step, and the served keys copied to the host for the store's key index.

`make gpu-check` runs the one-rank `CUDA default` step on a GPU under `torch.cuda.set_sync_debug_mode("error")`
(`bench.gpu_probe`'s `sync_free_step`).
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from storage.embedding.config import StoreConfig
from storage.embedding.tiered import auto_device_cache_rows
from tests.helpers.host_reads import SIM_DEVICE, TransferMode
from tests.helpers.ranks import run_ranks
from tests.helpers.specs import make_spec
from trainer.distributed.context import init_distributed
from trainer.main import open_store
from trainer.models.config import ModelConfig
from trainer.train import StepInfo, Trainer

PUSH_COPY = ("trainer/distributed/sharded_embedding.py", "_to_store", "d2h:to")
SPLIT_SIZES = ("trainer/distributed/collectives.py", "exchange_counts", "sync:tolist")
SERVED_KEYS = ("trainer/distributed/sharded_embedding.py", "_pull_sync", "d2h:cpu")
WHY = {
    PUSH_COPY: "the row gradients copied to a host-memory store at every push (blocking)",
    SPLIT_SIZES: "the split sizes of the uneven all-to-alls, read once per step (the push reuses the pull's)",
    SERVED_KEYS: "the keys other ranks asked this one for, copied to the host for the store's key index",
}
"""Every transfer a step that neither logs nor checkpoints may make, and why."""
EXPECTED: dict[tuple[str, int], dict[tuple[str, str, str], int]] = {
    ("CUDA default", 1): {},
    ("host store", 1): {PUSH_COPY: 1},
    ("CUDA default", 2): {SPLIT_SIZES: 1, SERVED_KEYS: 1},
    ("host store", 2): {SPLIT_SIZES: 1, SERVED_KEYS: 1, PUSH_COPY: 1},
}
"""(configuration, ranks) -> the transfers of each such step, by (path, function, op)."""
BEFORE = {("CUDA default", 1): {PUSH_COPY: 1}}
"""The count before the device tier became CUDA's default (the host store's, `device_cache_rows` 0): for the record."""
HET_CACHE = {
    ("trainer/distributed/het_pull.py", "pull_with_clocks"): "the keys, clocks and rows that came back, to the host",
    ("trainer/distributed/het_pull.py", "_exchange_counts"): "the split sizes of its all-to-alls",
    ("trainer/distributed/het_pull.py", "_serve"): "the keys asked, to the key index; the stale rows, by a mask",
    ("trainer/distributed/routing.py", "apply_updates"): "the pending sums' counts, and their rows by masks",
    ("trainer/distributed/staleness.py", "accumulate"): "the cached copies' gradients, to the host cache",
    ("storage/embedding/rows/checks.py", "check_keys"): "the pushed keys, from the all-to-all to the key index",
}
"""The HET cache's device reads (issue 29; not a default): by function, their counts follow the cache's state."""

STORE = StoreConfig(embedding_dim=8, init_std=0.01, host_budget_mb=16)
MODEL = ModelConfig(num_heads=2, attention_layers=1, mlp_dims=(16,), dropout=0.0)
LOG_EVERY, CKPT_EVERY, STEPS = 4, 6, 9
FREE_BYTES = 80 << 30
"""The GPU memory `auto` sizes the device tier by here: an H100's 80 GiB."""


def _rank(rank: int, world: int, root: str, config: str, staleness_bound: int) -> None:
    tmp = Path(root)
    spec = make_spec(
        tmp / "features",
        tmp / "out",
        tmp / "local",
        store=STORE,
        model=MODEL,
        run_tag="reads",
        nproc_per_node=world,
        backend="gloo",
        device="cpu",
        batch_size=64,
        epochs=1,
        k_steps=2,
        log_every=LOG_EVERY,
        checkpoint_every=CKPT_EVERY,
        staleness_bound=staleness_bound,
        cache_rows=64,
    )
    fmt = spec.store.row_format(spec.optim.sparse_optimizer)
    rows = auto_device_cache_rows(spec.store, fmt, FREE_BYTES) if config == "CUDA default" else 0
    spec = dataclasses.replace(spec, store=dataclasses.replace(spec.store, device_cache_rows=rows))
    mode = TransferMode()
    per_step: list[dict] = []

    def hook(info: StepInfo) -> None:
        seen = mode.take()
        per_step.append({**dataclasses.asdict(info), "seen": [[*k, n] for k, n in seen.items()]})

    with mode:  # from before the store and the model exist: every tensor is followed from its birth
        ctx = init_distributed(spec.trainer)
        ctx.device = ctx.comm_device = SIM_DEVICE  # a CUDA rank under NCCL, on the CPU
        store = open_store(spec, ctx)
        try:
            trainer = Trainer(spec, ctx=ctx, store=store, step_hooks=[hook])
            mode.take()
            trainer.train()
            (tmp / f"steps-{rank}.json").write_text(json.dumps(per_step))
        finally:
            store.close()
            ctx.destroy()


def _steps(root: Path, world: int) -> tuple[list[Counter], list[Counter]]:
    """(each rank's steps that neither logged nor checkpointed, its log steps), as counters by (path, function, op)."""
    plain, logged = [], []
    for rank in range(world):
        steps = json.loads((root / f"steps-{rank}.json").read_text())
        assert len(steps) == steps[0]["total_steps"] >= STEPS, "the day has the steps the test needs"
        for s in steps:
            seen = Counter({(p, f, op): n for p, f, op, n in s["seen"]})
            if s["checkpointed"]:
                continue
            (logged if s["step"] % LOG_EVERY == 0 or s["step"] == s["total_steps"] else plain).append(seen)
    return plain, logged


def _check(root: Path, config: str, world: int) -> None:
    plain, logged = _steps(root, world)
    assert len(plain) >= 5 * world, "steps without a log line or a checkpoint were counted"
    expected = Counter(EXPECTED[(config, world)])
    for seen in plain:
        assert seen == expected, f"{config}, {world} rank(s): a step made {dict(seen)}, expected {dict(expected)}"
    assert set(expected) <= set(WHY)
    for seen in logged:  # the counter sees the reads a log step makes: the loss, and a device tier's deferred check
        assert seen[("trainer/step.py", "train_step", "sync:item")] == 1, seen
        deferred = ("storage/embedding/caching_tier.py", "check_updates", "sync:__bool__")
        assert seen[deferred] == (config == "CUDA default"), seen


def _features(tmp_path: Path) -> Path:
    # imported here: the spawned ranks need not import the launch tests' module
    from tests.trainer.launch.test_torchrun import write_features

    write_features(tmp_path / "features", train_rows=STEPS * 64 * 2 + 10, eval_rows=50)
    return tmp_path


@pytest.mark.parametrize("config", ["CUDA default", "host store"])
def test_one_rank_transfers_per_step(tmp_path: Path, config: str) -> None:
    _rank(0, 1, str(_features(tmp_path)), config, 0)
    _check(tmp_path, config, 1)


@pytest.mark.distributed
@pytest.mark.parametrize("config", ["CUDA default", "host store"])
def test_two_ranks_transfers_per_step(tmp_path: Path, free_port: int, config: str) -> None:
    run_ranks(_rank, 2, free_port, str(_features(tmp_path)), config, 0)
    _check(tmp_path, config, 2)


@pytest.mark.distributed
def test_the_het_cache_reads_only_where_it_is_known_to(tmp_path: Path, free_port: int) -> None:
    """The HET cache over the CUDA default: its steps read the device in `HET_CACHE`'s functions (and the
    synchronous path's places), nowhere else, and each of those functions still does."""
    run_ranks(_rank, 2, free_port, str(_features(tmp_path)), "CUDA default", 2)
    plain, _ = _steps(tmp_path, 2)
    sites = {(p, f) for seen in plain for p, f, _ in seen}
    known = set(HET_CACHE) | {(p, f) for p, f, _ in WHY}
    assert sites <= known, f"transfers in a step: {sorted(sites - known)}"
    assert set(HET_CACHE) <= sites, f"no longer made (take them out of HET_CACHE): {sorted(set(HET_CACHE) - sites)}"
