"""k-step Adam: k=1 is synchronous data-parallel Adam; k>1 merges parameters and both moments."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config, run_ranks
from trainer.data import Batch
from trainer.distributed.context import init_distributed
from trainer.distributed.sharded_embedding import ShardedEmbedding
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CROSS_PREFIX, CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.step import train_step

pytestmark = pytest.mark.distributed

B, N_DENSE, N_FIELDS, DIM, STEPS = 8, 3, 4, 4, 3


def _model() -> CTRModel:
    torch.manual_seed(0)
    return CTRModel(
        ModelConfig(dropout=0.0, num_heads=2, mlp_dims=(8,)), num_dense=N_DENSE, num_fields=N_FIELDS, dim=DIM
    )


def _batch(rank: int, step: int) -> Batch:
    g = torch.Generator().manual_seed(7919 * step + rank)
    return Batch(
        labels=torch.randint(0, 2, (B,), generator=g).float(),
        dense=torch.rand(B, N_DENSE, generator=g),
        keys=torch.randint(0, 25, (B, N_FIELDS), generator=g),
    )


def _concat(batches: list[Batch]) -> Batch:
    return Batch(*(torch.cat([getattr(b, f) for b in batches]) for f in ("labels", "dense", "keys")))


ALL_KEYS = torch.arange(25)


def _k1_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config())
    try:
        model = _model()
        opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01)
        store = MemoryStore(DIM, init_std=0.1)
        sparse = ShardedEmbedding(store, ctx, lr=0.05)
        for step in range(1, STEPS + 1):
            train_step(model, sparse, opt, _batch(rank, step), step=step)
            assert not opt.maybe_merge(step)  # k=1 never merges: gradients were averaged
        owned = ALL_KEYS[ALL_KEYS % world == rank]
        torch.save(
            {"state": model.state_dict(), "keys": owned, "rows": store.lookup(owned).rows},
            Path(out_dir) / f"r{rank}.pt",
        )
        assert opt.sync_bytes == STEPS * sum(p.numel() for p in model.parameters()) * 4
    finally:
        ctx.destroy()


def test_k1_equals_one_process_adam_on_concatenated_batches(tmp_path: Path, free_port: int) -> None:
    world = 2
    run_ranks(_k1_rank, world, free_port, str(tmp_path))
    ctx = init_distributed(cpu_trainer_config())  # world of one
    model = _model()
    opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01)
    store = MemoryStore(DIM, init_std=0.1)
    sparse = ShardedEmbedding(store, ctx, lr=0.05)
    for step in range(1, STEPS + 1):
        train_step(model, sparse, opt, _concat([_batch(r, step) for r in range(world)]), step=step)
    start = _model().state_dict()
    for r in range(world):
        got = torch.load(tmp_path / f"r{r}.pt")
        for name, want in model.state_dict().items():
            have = got["state"][name]
            if name.endswith("in_proj_bias"):
                # The key bias adds the same term to every score of a query, which softmax cancels:
                # its true gradient is 0, and Adam (g / sqrt(v)) scales the float round-off it gets
                # to steps of size ~lr, different for any change of summation order.  Only the
                # query and value biases are checked tightly.
                key = slice(DIM, 2 * DIM)
                torch.testing.assert_close(have[key], want[key], rtol=0, atol=STEPS * 0.01)
                have, want = torch.cat([have[:DIM], have[2 * DIM :]]), torch.cat([want[:DIM], want[2 * DIM :]])
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
        assert any(not torch.equal(got["state"][n], start[n]) for n in start)  # it did train
        torch.testing.assert_close(got["rows"], store.lookup(got["keys"]).rows, rtol=1e-5, atol=1e-6)


def _kstep_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config())
    try:
        model = _model()
        opt = KStepAdam(model.named_parameters(), ctx, k=2, lr=0.01)
        sparse = ShardedEmbedding(MemoryStore(DIM), ctx, lr=0.05)
        train_step(model, sparse, opt, _batch(rank, 1), step=1)
        assert not opt.maybe_merge(1)
        train_step(model, sparse, opt, _batch(rank, 2), step=2)

        def snap() -> list[torch.Tensor]:
            out = []
            for p in model.parameters():
                st = opt.adam.state[p]
                out += [p.detach().clone(), st["exp_avg"].clone(), st["exp_avg_sq"].clone()]
            return out

        before = snap()
        assert opt.maybe_merge(2)
        torch.save({"before": before, "after": snap(), "bytes": opt.sync_bytes}, Path(out_dir) / f"r{rank}.pt")
    finally:
        ctx.destroy()


def test_kstep_merge_averages_params_and_both_moments(tmp_path: Path, free_port: int) -> None:
    world = 2
    run_ranks(_kstep_rank, world, free_port, str(tmp_path))
    res = [torch.load(tmp_path / f"r{r}.pt") for r in range(world)]
    n_params = sum(p.numel() for p in _model().parameters())
    assert res[0]["bytes"] == 3 * n_params * 4  # params + exp_avg + exp_avg_sq, once
    # local steps on different data made the ranks diverge; the merge makes them identical means
    assert any(not torch.equal(a, b) for a, b in zip(res[0]["before"], res[1]["before"], strict=True))
    for i in range(len(res[0]["before"])):
        want = (res[0]["before"][i] + res[1]["before"][i]) / 2
        for r in range(world):
            torch.testing.assert_close(res[r]["after"][i], want, rtol=1e-6, atol=1e-7)


def test_state_tensors_round_trip_continues_the_step() -> None:
    ctx = init_distributed(cpu_trainer_config())
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    opt = KStepAdam(model.named_parameters(), ctx, k=4, lr=0.01)
    sparse = ShardedEmbedding(MemoryStore(DIM), ctx, lr=0.05)
    for step in (1, 2):
        train_step(model, sparse, opt, _batch(0, step), step=step)
    saved = opt.state_tensors()
    assert int(saved["step"][0]) == 2 and set(saved) == {"step"} | {
        f"{n}.{m}" for n in names for m in ("exp_avg", "exp_avg_sq")
    }
    other = _model()
    opt2 = KStepAdam(other.named_parameters(), ctx, k=4, lr=0.01)
    opt2.load_state_tensors(saved)
    for (n, p), q in zip(model.named_parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(opt.adam.state[p]["exp_avg_sq"], opt2.adam.state[q]["exp_avg_sq"], msg=n)
        assert float(opt2.adam.state[q]["step"]) == 2.0
    # a saved model without the moments of a parameter does not fit: no silent zeros
    with pytest.raises(ValueError, match=r"optimizer state lacks \['bias.exp_avg', 'bias.exp_avg_sq'\]"):
        opt2.load_state_tensors({k: v for k, v in saved.items() if not k.startswith("bias.")})


def test_state_dict_carries_the_moments_and_the_counters_across_a_restart() -> None:
    ctx = init_distributed(cpu_trainer_config())
    model = _model()
    opt = KStepAdam(model.named_parameters(), ctx, k=4, lr=0.01)
    sparse = ShardedEmbedding(MemoryStore(DIM), ctx, lr=0.05)
    train_step(model, sparse, opt, _batch(0, 1), step=1)
    opt.merges, opt.sync_bytes, opt.sync_seconds = 3, 1234, 0.5  # what a multi-rank run would have counted
    state = opt.state_dict()
    restarted = KStepAdam(_model().named_parameters(), ctx, k=4, lr=0.01)
    restarted.load_state_dict(state)
    assert (restarted.steps, restarted.merges, restarted.sync_bytes, restarted.sync_seconds) == (1, 3, 1234, 0.5)
    for name, t in restarted.state_dict()["moments"].items():
        assert torch.equal(t, state["moments"][name]), name
    with pytest.raises(ValueError, match=r"optimizer state lacks \['merges'\]"):
        restarted.load_state_dict({k: v for k, v in state.items() if k != "merges"})


def test_k_must_be_positive() -> None:
    with pytest.raises(ValueError, match="k_steps"):
        KStepAdam(_model().named_parameters(), init_distributed(cpu_trainer_config()), k=0, lr=0.01)


def test_fused_adam_takes_the_per_tensor_loops_steps() -> None:
    """KStepAdam runs fused Adam for speed; its parameters and moments must follow the
    per-tensor loop of torch.optim.Adam within float rounding, through lr changes (the schedule) and
    weight decay, from a warm-started state (moments and step loaded from a model directory)."""
    ctx = init_distributed(cpu_trainer_config())
    ours, ref = _model(), _model()
    names = {p: n for n, p in ours.named_parameters()}
    opt = KStepAdam(ours.named_parameters(), ctx, k=1, lr=0.01, weight_decay=0.01)
    assert opt.adam.defaults["fused"] is True
    loop = torch.optim.Adam(ref.parameters(), lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
    g = torch.Generator().manual_seed(3)
    warm = {
        f"{n}.{m}": torch.rand(p.shape, generator=g) * 1e-3 for p, n in names.items() for m in ("exp_avg", "exp_avg_sq")
    }
    opt.load_state_tensors({**warm, "step": torch.tensor([5])})
    for n, p in ref.named_parameters():
        loop.state[p] = {
            "step": torch.tensor(5.0),
            "exp_avg": warm[f"{n}.exp_avg"].clone(),
            "exp_avg_sq": warm[f"{n}.exp_avg_sq"].clone(),
        }
    for step in range(1, 13):
        lr = 0.01 * (0.5 + step / 24)  # a changing lr, as `set_step_lrs` sets it
        for group in (*opt.adam.param_groups, *loop.param_groups):
            group["lr"] = lr
        for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
            grad = torch.randn(p.shape, generator=g)
            p.grad, q.grad = grad.clone(), grad.clone()
        opt.step()
        loop.step()
    for (n, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-8, msg=n)
        for m in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.adam.state[p][m], loop.state[q][m], rtol=1e-6, atol=1e-10, msg=f"{n}.{m}")


def test_a_prefix_at_scale_zero_is_held_still_and_the_rest_train_at_lr() -> None:
    ctx = init_distributed(cpu_trainer_config())  # world of one
    model, scaled = _model(), _model()
    frozen = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01, lr_scales={CROSS_PREFIX: 0.0})
    plain = KStepAdam(scaled.named_parameters(), ctx, k=1, lr=0.01, lr_scales={"over.": 0.5})
    assert [g["lr"] for g in frozen.adam.param_groups] == [0.01]  # the held prefix is in no group
    assert set(frozen.held) == {n for n, _ in model.named_parameters() if n.startswith(CROSS_PREFIX)}
    assert not any(p.requires_grad for p in model.cross.parameters())  # no weight gradients in the backward
    assert [g["lr"] for g in plain.adam.param_groups] == [0.01, 0.005]
    with torch.no_grad():  # a trained head, so the cross network's layers get gradients too
        model.cross.head.weight.fill_(0.1)
    start = {n: t.clone() for n, t in model.state_dict().items()}
    sparse = ShardedEmbedding(MemoryStore(DIM, init_std=0.1), ctx, lr=0.05)
    for step in range(1, STEPS + 1):
        train_step(model, sparse, frozen, _batch(0, step), step=step)
    after = model.state_dict()
    moved = {n for n in start if not torch.equal(after[n], start[n])}
    assert moved and not any(n.startswith(CROSS_PREFIX) for n in moved)
    assert set(frozen.state_tensors()) == set(plain.state_tensors())  # every moment is saved either way
    warm = {n: t + 1 for n, t in plain.state_tensors().items()}  # a model whose day trained the cross term
    frozen.load_state_tensors(warm)
    train_step(model, sparse, frozen, _batch(0, STEPS + 1), step=STEPS + 1)
    saved = frozen.state_tensors()
    assert all(torch.equal(saved[n], warm[n]) for n in saved if n.startswith(CROSS_PREFIX))  # saved as loaded
    assert not all(torch.equal(saved[n], warm[n]) for n in saved if not n.startswith(CROSS_PREFIX))
