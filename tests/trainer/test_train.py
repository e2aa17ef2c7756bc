"""One training step: nothing of a step with a non-finite loss is applied; with bags of keys the fixed and
bag keys are pulled together and the pushed row gradients are those of a plain torch reference (with the wide
term's own loss, `optim.wide_loss`, too); 2 gloo ranks train the same model as 1 rank on the concatenated batches."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from storage.embedding.memory import MemoryStore
from tests.helpers.bags import (
    BAG_FIELD,
    MISSING,
    D,
    V,
    bag_model,
    field_bags,
    random_bag_batch,
    reference_emb,
)
from tests.helpers.host_reads import host_reads, unmarked
from tests.helpers.ranks import cpu_trainer_config, run_ranks
from trainer.bags import FieldBags
from trainer.data import Batch
from trainer.distributed.context import init_distributed
from trainer.distributed.routing import unique_keys
from trainer.distributed.sharded_embedding import Pulled, ShardedEmbedding
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import BIAS_SCALE, CROSS_PREFIX, CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.step import NonFiniteLossError, train_step


def test_non_finite_loss_raises_naming_the_step_before_any_update() -> None:
    ctx = init_distributed(cpu_trainer_config())
    torch.manual_seed(0)
    model = CTRModel(ModelConfig(dropout=0.0, num_heads=1, mlp_dims=(4,)), num_dense=1, num_fields=2, dim=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    store = MemoryStore(2)
    opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.1)
    batch = Batch(
        labels=torch.ones(3), dense=torch.tensor([[0.0], [float("nan")], [1.0]]), keys=torch.tensor([[1, 2]] * 3)
    )
    with pytest.raises(NonFiniteLossError, match="at step 7"):
        train_step(model, ShardedEmbedding(store, ctx, lr=0.1), opt, batch, step=7)
    assert len(store) == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---- one step with bags --------------------------------------------------------------------------


class _TableSparse:
    """The pull/push contract of `ShardedEmbedding` over one in-memory table, recording what is pushed."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table, self.dim = table, table.shape[1]
        self.ctx = SimpleNamespace(device=torch.device("cpu"), rank=0, world_size=1)
        self.pulls: list[torch.Tensor] = []
        self.pushed = torch.zeros_like(table)

    def pull(self, keys: torch.Tensor) -> Pulled:
        self.pulls.append(keys.clone())
        return Pulled(self.table[keys].clone(), *unique_keys(keys))

    def push(self, pulled: Pulled, grads: torch.Tensor) -> None:
        self.pushed.index_add_(0, pulled.unique[pulled.inverse], grads)  # duplicates summed, as the owners do

    def check_updates(self) -> None:
        """An in-memory table defers no refusal."""


@pytest.mark.parametrize(
    ("mode", "arch", "l2"), [("mean", "attention", 0.0), ("sum", "attention", 0.3), ("mean", "dnn", 0.3)]
)
def test_a_training_step_pushes_the_row_gradients_of_the_plain_torch_reference(mode: str, arch: str, l2: float) -> None:
    torch.manual_seed(3)
    keys, lists = random_bag_batch(2)
    batch = Batch(
        labels=torch.tensor([1.0, 0, 1, 0, 0, 1]), dense=torch.rand(6, 2), keys=keys, bags=(field_bags(lists),)
    )
    table = torch.randn(V, D)

    ref_model, ref_table = bag_model(mode, arch), nn.Parameter(table.clone())
    emb = reference_emb(ref_table, keys, lists, mode)
    loss = F.binary_cross_entropy_with_logits(ref_model(batch.dense, emb), batch.labels)
    # embedding L2: (l2 / 2) * mean_b sum_f sum_(k in cell) w_k ||e_k||^2, w_k = 1 / |bag| under mean pooling
    w = [[1.0 / max(len(x), 1) if mode == "mean" else 1.0] * len(x) for x in lists]
    for b in range(6):
        for f in range(3):
            members = lists[b] if f == BAG_FIELD and lists[b] else [int(keys[b, f])]
            weights = w[b] if f == BAG_FIELD and lists[b] else [1.0]
            loss = loss + l2 / 2 / 6 * sum(
                wk * ref_table[k].pow(2).sum() for k, wk in zip(members, weights, strict=True)
            )
    loss.backward()

    model, sparse = bag_model(mode, arch), _TableSparse(table.clone())
    train_step(model, sparse, torch.optim.SGD(model.parameters(), lr=0.0), batch, step=1, embedding_l2=l2)  # type: ignore[arg-type]
    assert len(sparse.pulls) == 1  # the fixed keys and the bag keys in one pull
    assert set(sparse.pulls[0].tolist()) == set(keys[:, [0, 2]].reshape(-1).tolist()) | {
        k for x in lists for k in x
    } | {MISSING}
    torch.testing.assert_close(sparse.pushed, ref_table.grad, rtol=1e-5, atol=1e-7)
    for (name, p), ref in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("arch", ["attention", "dnn"])
def test_the_wide_loss_adds_the_wide_terms_own_log_loss_and_the_step_reports_the_models(arch: str) -> None:
    """`optim.wide_loss` w: the gradients are those of loss + w * log loss(wide term + bias) (a model without a
    wide term: of the loss alone), and the step returns the model's loss, not the objective."""
    torch.manual_seed(5)
    keys, lists = random_bag_batch(2)
    batch = Batch(
        labels=torch.tensor([1.0, 0, 1, 0, 0, 1]), dense=torch.rand(6, 2), keys=keys, bags=(field_bags(lists),)
    )
    table, w = torch.randn(V, D), 0.7

    ref_model, ref_table = bag_model("mean", arch), nn.Parameter(table.clone())
    emb = reference_emb(ref_table, keys, lists, "mean")
    loss = F.binary_cross_entropy_with_logits(ref_model(batch.dense, emb), batch.labels)
    objective = loss
    if arch == "attention":  # logistic regression on the key weights (column 0), the dense features and the bias
        wide = ref_model.wide(batch.dense).squeeze(-1) + emb[:, :, 0].sum(1) + BIAS_SCALE * ref_model.bias
        objective = loss + w * F.binary_cross_entropy_with_logits(wide, batch.labels)
    objective.backward()

    model, sparse = bag_model("mean", arch), _TableSparse(table.clone())
    got = train_step(model, sparse, torch.optim.SGD(model.parameters(), lr=0.0), batch, step=1, wide_loss=w)  # type: ignore[arg-type]
    torch.testing.assert_close(got, loss.detach())
    torch.testing.assert_close(sparse.pushed, ref_table.grad, rtol=1e-5, atol=1e-7)
    for (name, p), ref in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    if arch == "attention":  # and it is not the model's loss alone
        plain, other = _TableSparse(table.clone()), bag_model("mean", arch)
        train_step(other, plain, torch.optim.SGD(other.parameters(), lr=0.0), batch, step=1)  # type: ignore[arg-type]
        assert not torch.allclose(plain.pushed, sparse.pushed)


def test_bag_pooling_none_trains_on_the_first_keys_as_before() -> None:
    keys, lists = random_bag_batch(4)
    batch = Batch(labels=torch.ones(6), dense=torch.rand(6, 2), keys=keys, bags=(field_bags(lists),))
    sparse = _TableSparse(torch.randn(V, D))
    model = bag_model("none")
    train_step(model, sparse, torch.optim.SGD(model.parameters(), lr=0.0), batch, step=1)  # type: ignore[arg-type]
    assert sparse.pulls[0].tolist() == keys.reshape(-1).tolist()


# ---- 2 gloo ranks = 1 rank on the concatenated batches --------------------------------------------

STEPS, B_RANK = 3, 6


def _rank_batch(rank: int, step: int) -> Batch:
    keys, lists = random_bag_batch(1000 * step + rank, B=B_RANK)
    g = torch.Generator().manual_seed(step * 31 + rank)
    return Batch(
        labels=torch.randint(0, 2, (B_RANK,), generator=g).float(),
        dense=torch.rand(B_RANK, 2, generator=g),
        keys=keys,
        bags=(field_bags(lists),),
    )


def _concat(batches: list[Batch]) -> Batch:
    bags = [b.bags[0] for b in batches]
    shifts = np.cumsum([0] + [int(x.values.numel()) for x in bags[:-1]])
    offsets = torch.cat([bags[0].offsets[:1]] + [x.offsets[1:] + int(s) for x, s in zip(bags, shifts, strict=True)])
    return Batch(
        *(torch.cat([getattr(b, f) for b in batches]) for f in ("labels", "dense", "keys")),
        bags=(FieldBags(BAG_FIELD, torch.cat([x.values for x in bags]), offsets),),
    )


def _train(rank: int, world: int, ctx) -> tuple[CTRModel, MemoryStore]:
    model = bag_model("mean")
    opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01)
    store = MemoryStore(D, init_std=0.1)
    sparse = ShardedEmbedding(store, ctx, lr=0.05)
    for step in range(1, STEPS + 1):
        batch = _rank_batch(rank, step) if world > 1 else _concat([_rank_batch(r, step) for r in range(2)])
        train_step(model, sparse, opt, batch, step=step, embedding_l2=0.1)
    return model, store


def _bag_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config())
    try:
        model, store = _train(rank, world, ctx)
        owned = torch.arange(V)[torch.arange(V) % world == rank]
        torch.save(
            {"state": model.state_dict(), "keys": owned, "rows": store.lookup(owned).rows},
            Path(out_dir) / f"r{rank}.pt",
        )
    finally:
        ctx.destroy()


@pytest.mark.distributed
def test_two_ranks_with_bags_train_what_one_rank_trains_on_the_concatenated_batches(
    tmp_path: Path, free_port: int
) -> None:
    run_ranks(_bag_rank, 2, free_port, str(tmp_path))
    model, store = _train(0, 1, init_distributed(cpu_trainer_config()))
    start = bag_model("mean").state_dict()
    for r in range(2):
        got = torch.load(tmp_path / f"r{r}.pt")
        torch.testing.assert_close(got["rows"], store.lookup(got["keys"]).rows, rtol=1e-5, atol=1e-6)
        for name, want in model.state_dict().items():
            have = got["state"][name]
            if name.endswith("in_proj_bias"):  # the key bias: see test_kstep_adam (its true gradient is 0)
                have, want = torch.cat([have[:D], have[2 * D :]]), torch.cat([want[:D], want[2 * D :]])
            torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    assert any(not torch.equal(model.state_dict()[n], start[n]) for n in start)  # it did train
    bag_keys = torch.tensor(
        sorted({k for r in range(2) for s in range(1, STEPS + 1) for k in _rank_batch(r, s).bags[0].values.tolist()})
    )
    assert not torch.equal(
        store.lookup(bag_keys).rows, MemoryStore(D, init_std=0.1).lookup(bag_keys).rows
    )  # bag rows trained


# ---- host reads of a step ------------------------------------------------------------------------


def _step_parts(ctx, seed: int = 0):
    torch.manual_seed(seed)
    model = CTRModel(ModelConfig(num_heads=1, mlp_dims=(8,), dropout=0.0), num_dense=3, num_fields=4, dim=4)
    opt = KStepAdam(model.named_parameters(), ctx, k=2, lr=0.01)
    sparse = ShardedEmbedding(MemoryStore(4, init_std=0.1), ctx, lr=0.05)
    g = torch.Generator().manual_seed(seed + ctx.rank)
    batches = [
        Batch(
            labels=(torch.rand(32, generator=g) < 0.3).float(),
            dense=torch.rand(32, 3, generator=g),
            keys=torch.randint(0, 50, (32, 4), generator=g),
        )
        for _ in range(4)
    ]
    return model, sparse, opt, batches


def test_a_step_reads_the_device_only_at_its_documented_points() -> None:
    """One rank: no host read at all unless the loss is checked (every step on CPU, at log points on CUDA)."""
    ctx = init_distributed(cpu_trainer_config())
    model, sparse, opt, batches = _step_parts(ctx)
    for i in range(2):
        train_step(model, sparse, opt, batches[i], step=i + 1)
    with host_reads(("trainer",)) as quiet:
        train_step(model, sparse, opt, batches[2], step=3, check_loss=False)
        opt.maybe_merge(3)
    assert not quiet, f"a CUDA step would wait for the GPU at {sorted(quiet)}"
    with host_reads(("trainer",)) as checked:
        train_step(model, sparse, opt, batches[3], step=4)
    assert sum(checked.values()) == 1 and not unmarked(checked), checked


def _host_reads_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config())
    try:
        model, sparse, opt, batches = _step_parts(ctx)
        for i in range(2):
            train_step(model, sparse, opt, batches[i], step=i + 1)
        with host_reads(("trainer",)) as seen:
            train_step(model, sparse, opt, batches[2], step=3, check_loss=False)
        assert not unmarked(seen), f"undocumented host reads in the step: {unmarked(seen)}"
        counts = [n for (path, _, name), n in seen.items() if path.endswith("collectives.py") and name == "tolist"]
        assert counts == [1], f"the all-to-all split sizes are read once per step (the push reuses the pull's): {seen}"
        assert sparse.bytes_by_kind["push"] > 0
    finally:
        ctx.destroy()


@pytest.mark.distributed
def test_two_ranks_read_the_split_sizes_once_per_step(tmp_path: Path, free_port: int) -> None:
    run_ranks(_host_reads_rank, 2, free_port, str(tmp_path))


# ---- a cross term held still (optim.cross_lr_scale 0) ---------------------------------------------


def _cross_run(held: bool, head: float) -> tuple[CTRModel, KStepAdam, MemoryStore, list[torch.Tensor]]:
    """3 steps of the default-shaped model (dense buckets, cross, wide) with the cross term at lr 0:
    held (`KStepAdam` holds it, `CTRModel.hold_cross`) or as before (an Adam group at lr 0)."""
    ctx = init_distributed(cpu_trainer_config())
    torch.manual_seed(0)
    model = CTRModel(
        ModelConfig(num_heads=2, mlp_dims=(8,), dropout=0.0, dense_buckets=4), num_dense=3, num_fields=4, dim=4
    )
    with torch.no_grad():
        model.cross.head.weight.fill_(head)  # 0: never trained; else trained on an earlier day
    if held:
        opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01, weight_decay=1e-4, lr_scales={CROSS_PREFIX: 0.0})
        assert model.hold_cross() == (head == 0)
    else:
        opt = KStepAdam(model.named_parameters(), ctx, k=1, lr=0.01, weight_decay=1e-4, lr_scales={CROSS_PREFIX: 1.0})
        opt.adam.param_groups[1]["lr"] = 0.0
    store = MemoryStore(4, init_std=0.1)
    sparse = ShardedEmbedding(store, ctx, lr=0.05)
    losses = [
        train_step(model, sparse, opt, b, step=i + 1, embedding_l2=0.1)
        for i, b in enumerate(_step_parts(ctx, seed=5)[3])
    ]
    return model, opt, store, losses


@pytest.mark.parametrize("head", [0.0, 0.05])
def test_a_held_cross_term_trains_the_day_the_lr_zero_group_trained(head: float) -> None:
    """Held still, the cross term takes no Adam step and no gradient: skipped while zero, run for the rows'
    gradients once trained.  The day's losses, parameters, rows and the other moments are those of
    training it at lr 0, bit for bit; its own moments are saved as they were (the lr 0 group moved them)."""
    old_model, old_opt, old_store, old_losses = _cross_run(False, head)
    model, opt, store, losses = _cross_run(True, head)
    assert [float(x) for x in losses] == [float(x) for x in old_losses]
    for name, want in old_model.state_dict().items():
        assert torch.equal(model.state_dict()[name], want), name
    keys = torch.arange(50)
    assert torch.equal(store.lookup(keys).rows, old_store.lookup(keys).rows)
    saved, old_saved = opt.state_tensors(), old_opt.state_tensors()
    assert set(saved) == set(old_saved)  # every moment is saved: a later day warm-starts from it
    for name, t in saved.items():
        if name.startswith(CROSS_PREFIX):
            assert not t.any(), name  # held: as loaded (none: zeros)
        else:
            assert torch.equal(t, old_saved[name]), name
    assert any(old_saved[n].any() for n in old_saved if n.startswith(CROSS_PREFIX))  # the lr 0 group did move them
    assert all(p.grad is None for p in model.cross.parameters())  # no weight gradients were computed
