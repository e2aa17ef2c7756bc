"""No host reads in a step: `Trainer.train` reads nothing of the device outside its log and checkpoint
steps, on 1 and 2 ranks, with and without the HET cache and the device tier.

On CUDA a read of a device value on the host waits for the GPU.  The count is made on CPU by a
`torch.overrides.TorchFunctionMode` (`tests.helpers.host_reads.HostReadMode`), which sees every
`.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `bool()`/`int()`/`float()` and boolean-mask index a step
makes, so the test runs where the suite runs.  Reads of values that live on the host on a GPU rank
too (the reader's keys, the host tier's key index) wait for nothing: `HOST_SIDE` names each such
function and why; any other read in a step that neither logs nor checkpoints fails the test.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest

from storage.embedding.config import StoreConfig
from tests.helpers.host_reads import HostReadMode
from tests.helpers.ranks import run_ranks
from tests.helpers.specs import make_spec
from trainer.distributed.context import init_distributed
from trainer.main import open_store
from trainer.models.config import ModelConfig
from trainer.train import StepInfo, Trainer

HOST_SIDE = {
    ("trainer/distributed/routing.py", "unique_keys"): "deduplicates the reader's keys, on the host",
    ("trainer/distributed/routing.py", "route_keys"): "counts the reader's keys per owner, on the host",
    ("storage/embedding/rows/checks.py", "check_keys"): "the store's key index is a host NumPy array",
    ("storage/embedding/rows/buffer.py", "_take"): "the host tier gathers its own (host) rows",
    ("storage/embedding/rows/checks.py", "all_finite"): "a tier checks the gradients only where its rows are host rows",
}
"""(path, function) -> why its reads are of host values on a GPU rank as well."""
HOST_TIER_CHECKS = {
    ("storage/embedding/rows/format.py", "step"): "the new rows' one finiteness check, of host rows",
}
"""The store's refusal of non-finite gradients, a read of host values where the rows live on the host."""
LEFT = {
    "device tier": {
        (
            "storage/embedding/rows/format.py",
            "step",
        ): "the new rows' one finiteness check per update: on a GPU device tier a wait for the GPU",
    },
    "2 ranks": {
        (
            "trainer/distributed/collectives.py",
            "exchange_counts",
        ): "the uneven all-to-alls' split sizes (NCCL: on the GPU); fixed-capacity all-to-alls would remove it",
    },
    "HET cache": {  # a host structure over host keys, with a device read at the push (the device gradients'
        # mask in `_stage_cached`, their copy to the host in `accumulate`)
        ("trainer/distributed/sharded_embedding.py", "_pull_cached"): "masks of cached / valid keys",
        ("trainer/distributed/sharded_embedding.py", "_stage_cached"): "the direct keys' gradients, by a mask",
        ("trainer/distributed/het_pull.py", "pull_with_clocks"): "stale copies by a mask; split sizes",
        ("trainer/distributed/het_pull.py", "_exchange_counts"): "split sizes",
        ("trainer/distributed/het_pull.py", "_serve"): "the owner's rows to send, by a mask; split sizes",
        ("trainer/distributed/het_pull.py", "_split_by_owner"): "split sizes",
        ("trainer/distributed/het_pull.py", "<listcomp>"): "split sizes",
        ("trainer/distributed/routing.py", "apply_updates"): "rows updated more than once, by a mask",
        ("trainer/distributed/staleness.py", "serve"): "valid copies, by a mask",
        ("trainer/distributed/staleness.py", "accumulate"): "the cached copies' gradients, to the host",
        ("trainer/distributed/staleness.py", "insert"): "new copies, to the host",
        ("trainer/distributed/staleness.py", "_take"): "slots by a mask",
    },
}
"""Device reads a step still makes (issue 29), by the configuration that makes them: the test fails when
one is no longer made (take it out) or another appears."""

STORE = StoreConfig(embedding_dim=8, init_std=0.01, host_budget_mb=16)
MODEL = ModelConfig(num_heads=2, attention_layers=1, mlp_dims=(16,), dropout=0.0)
LOG_EVERY, CKPT_EVERY, STEPS = 4, 6, 9


def _rank(rank: int, world: int, root: str, device_cache_rows: int, staleness_bound: int) -> None:
    tmp = Path(root)
    spec = make_spec(
        tmp / "features",
        tmp / "out",
        tmp / "local",
        store=dataclasses.replace(STORE, device_cache_rows=device_cache_rows),
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
    ctx = init_distributed(spec.trainer)
    store = open_store(spec, ctx)
    mode = HostReadMode()
    per_step: list[dict] = []

    def hook(info: StepInfo) -> None:
        reads = mode.take()
        per_step.append(
            {
                "step": info.step,
                "total": info.total_steps,
                "checkpointed": info.checkpointed,
                "reads": [[*k, n] for k, n in reads.items()],
            }
        )

    try:
        trainer = Trainer(spec, ctx=ctx, store=store, step_hooks=[hook])
        with mode:
            trainer.train()
        (tmp / f"reads-{rank}.json").write_text(json.dumps(per_step))
    finally:
        store.close()
        ctx.destroy()


def _step_reads(root: Path, world: int) -> tuple[int, Counter]:
    """The steps that neither logged nor checkpointed (all ranks), and their reads by (path, function)."""
    counted, reads = 0, Counter()
    for rank in range(world):
        steps = json.loads((root / f"reads-{rank}.json").read_text())
        assert len(steps) == steps[0]["total"] >= STEPS, "the day has the steps the test needs"
        for s in steps:
            if s["step"] % LOG_EVERY == 0 or s["step"] == s["total"] or s["checkpointed"]:
                continue
            counted += 1
            reads.update({(p, f): n for p, f, _, n in s["reads"]})
    return counted, reads


def _check(reads: Counter, *left: str, host_tier: bool) -> None:
    """Every read is host-side or `LEFT` for `left`, and every `LEFT` entry of `left` is still made."""
    allowed = {**HOST_SIDE, **(HOST_TIER_CHECKS if host_tier else {})}
    expected = {k: v for case in left for k, v in LEFT[case].items() if k not in allowed}
    device = {k: n for k, n in reads.items() if k not in allowed}
    assert set(device) <= set(expected), f"host reads in a step: {sorted(set(device) - set(expected))}"
    assert set(expected) <= set(device), (
        f"no longer read (take them out of LEFT): {sorted(set(expected) - set(device))}"
    )


def _features(tmp_path: Path) -> Path:
    # imported here: the spawned ranks need not import the launch tests' module
    from tests.trainer.launch.test_torchrun import write_features

    write_features(tmp_path / "features", train_rows=STEPS * 64 * 2 + 10, eval_rows=50)
    return tmp_path


@pytest.mark.parametrize("device_cache_rows", [0, 256])
def test_one_rank_reads_the_device_only_at_log_and_checkpoint_steps(tmp_path: Path, device_cache_rows: int) -> None:
    _rank(0, 1, str(_features(tmp_path)), device_cache_rows, 0)
    counted, reads = _step_reads(tmp_path, 1)
    assert counted >= 5, "steps without a log line or a checkpoint were counted"
    assert ("trainer/train.py", "train_step") not in reads  # the loss: at log steps only
    _check(reads, *(["device tier"] if device_cache_rows else []), host_tier=not device_cache_rows)


@pytest.mark.distributed
@pytest.mark.parametrize(("device_cache_rows", "staleness_bound"), [(0, 0), (256, 2)])
def test_two_ranks_read_the_device_only_at_log_and_checkpoint_steps(
    tmp_path: Path, free_port: int, device_cache_rows: int, staleness_bound: int
) -> None:
    run_ranks(_rank, 2, free_port, str(_features(tmp_path)), device_cache_rows, staleness_bound)
    counted, reads = _step_reads(tmp_path, 2)
    assert counted >= 10, "steps without a log line or a checkpoint were counted"
    assert ("trainer/train.py", "train_step") not in reads
    left = ["2 ranks", *(["device tier"] if device_cache_rows else []), *(["HET cache"] if staleness_bound else [])]
    _check(reads, *left, host_tier=not device_cache_rows)
