"""Multi-valued fields: bags of keys are pulled with the fixed keys and pooled into their field's row.

Reads as the specification of `trainer.bags`: pooling equals `nn.EmbeddingBag` on the same rows,
an empty bag uses its field's missing key, a training step's row gradients equal those of a plain
torch reference, the reader hands bags over as flat keys + offsets, evaluation pools as training
did, and 2 gloo ranks train the same model as 1 rank on the concatenated batches.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from storage.embedding.memory import MemoryStore
from tests.helpers.ranks import cpu_trainer_config, run_ranks
from trainer.bags import FieldBags, Jagged, cells_l2_grad, expand_cells, pool_rows
from trainer.data import Batch, FeatureSchema, RankReader, read_schema, split_dir
from trainer.distributed.comm import ShardedEmbedding, init_distributed
from trainer.evaluate import FrozenEmbeddings, LoadedModel, score
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel
from trainer.optim.kstep_adam import KStepAdam
from trainer.train import train_step

V, D = 40, 4  # keys 0..V-1, embedding width
BAG_FIELD = 1  # of 3 fields; keys of field f are f, f+3, f+6, ... (disjoint across fields)
MISSING = 1  # the bag field's "missing key" in these tests


def _bags(lists: list[list[int]], field: int = BAG_FIELD) -> FieldBags:
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    values = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]) if lists else np.empty(0, np.int64)
    return FieldBags.from_jagged(field, Jagged(values=values, offsets=np.concatenate([[0], np.cumsum(lengths)])))


def _random_batch(seed: int, B: int = 6) -> tuple[torch.Tensor, list[list[int]]]:
    """(keys (B, 3), bags of field 1): every third bag is empty, and then k_1 is the missing key."""
    g = np.random.default_rng(seed)
    keys = torch.from_numpy(np.stack([g.integers(0, V // 3, B) * 3 + f for f in range(3)], 1).astype(np.int64))
    lists = []
    for b in range(B):
        n = 0 if b % 3 == 2 else int(g.integers(1, 5))
        lists.append([int(k) for k in g.integers(1, V // 3, n) * 3 + BAG_FIELD])  # repeats allowed
        keys[b, BAG_FIELD] = lists[-1][0] if n else MISSING
    return keys, lists


def _reference_emb(table: nn.Parameter, keys: torch.Tensor, lists: list[list[int]], mode: str) -> torch.Tensor:
    """emb (B, 3, D) the plain torch way: rows of the keys, the bag field through nn.EmbeddingBag."""
    bag = nn.EmbeddingBag(V, D, mode=mode)
    bag.weight = table
    flat = torch.tensor([k for x in lists for k in x], dtype=torch.int64)
    offsets = torch.tensor(np.cumsum([0] + [len(x) for x in lists[:-1]]), dtype=torch.int64)
    pooled = bag(flat, offsets)  # (B, D); an empty bag gives zeros
    empty = torch.tensor([not x for x in lists])
    pooled = torch.where(empty.unsqueeze(1), table[keys[:, BAG_FIELD]], pooled)  # empty bag -> missing key's row
    emb = table[keys]  # (B, 3, D)
    return torch.cat([emb[:, :BAG_FIELD], pooled.unsqueeze(1), emb[:, BAG_FIELD + 1 :]], dim=1)


# ---- pooling math ---------------------------------------------------------------------------------


def test_cells_list_each_field_key_and_each_nonempty_bag_in_row_major_order() -> None:
    keys = torch.tensor([[10, 11], [20, 21], [30, 31]])
    cells = expand_cells(keys, [_bags([[5, 7, 9], [], [8]])])
    assert cells.keys.tolist() == [10, 5, 7, 9, 20, 21, 30, 8]  # the empty bag keeps k_1 = 21
    assert cells.cell.tolist() == [0, 1, 1, 1, 2, 3, 4, 5]
    assert cells.counts.tolist() == [1, 3, 1, 1, 1, 1] and cells.shape == (3, 2) and not cells.plain
    plain = expand_cells(keys)
    assert plain.plain and plain.keys.tolist() == keys.reshape(-1).tolist()


def test_bags_that_do_not_fit_the_batch_are_refused() -> None:
    keys = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="do not fit a batch of 2 rows x 3 fields"):
        expand_cells(keys, [_bags([[1], [2], [3]])])  # 3 bags for 2 rows
    with pytest.raises(ValueError, match="field 3"):
        expand_cells(keys, [_bags([[1], [2]], field=3)])


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_pooling_equals_embedding_bag_on_the_same_rows_values_and_gradients(mode: str) -> None:
    torch.manual_seed(0)
    keys, lists = _random_batch(1)
    table = nn.Parameter(torch.randn(V, D))
    want = _reference_emb(table, keys, lists, mode)
    weight = torch.randn(want.shape)
    (want * weight).sum().backward()

    cells = expand_cells(keys, [_bags(lists)])
    rows = table.detach()[cells.keys].requires_grad_(True)  # what a pull returns: (N, D)
    got = pool_rows(rows, cells, mode)
    torch.testing.assert_close(got, want)
    (got * weight).sum().backward()
    per_key = torch.zeros(V, D).index_add_(0, cells.keys, rows.grad)  # what a push sums per key
    torch.testing.assert_close(per_key, table.grad)


def test_without_bags_pooling_is_a_view_of_the_pulled_rows() -> None:
    rows = torch.randn(6, D)
    cells = expand_cells(torch.arange(6).view(3, 2))
    assert pool_rows(rows, cells, "mean").data_ptr() == rows.data_ptr()
    with pytest.raises(ValueError, match="bag_pooling is none but the batch has bags"):
        pool_rows(torch.randn(4, D), expand_cells(torch.zeros(1, 2, dtype=torch.int64), [_bags([[1, 2, 3]])]), "none")


def test_embedding_l2_weights_bag_members_by_their_share_of_the_pooled_row() -> None:
    cells = expand_cells(torch.tensor([[3, 4], [6, 7]]), [_bags([[1, 4, 7, 10], []])])
    rows = torch.ones(cells.keys.numel(), 1)
    zero = torch.zeros_like(rows)
    # B = 2: a plain cell gets l2 * row / 2; each of the 4 bag members a quarter of that under mean
    assert cells_l2_grad(rows, zero, cells, "mean", 0.5).view(-1).tolist() == [
        0.25,
        0.0625,
        0.0625,
        0.0625,
        0.0625,
        0.25,
        0.25,
    ]
    assert cells_l2_grad(rows, zero, cells, "sum", 0.5).view(-1).tolist() == [0.25] * 7
    plain = expand_cells(torch.tensor([[3, 4]]))
    assert cells_l2_grad(torch.ones(2, 1), torch.zeros(2, 1), plain, "mean", 0.5).view(-1).tolist() == [0.5, 0.5]


# ---- one training step ----------------------------------------------------------------------------


class _TableSparse:
    """The pull/push contract of `ShardedEmbedding` over one in-memory table, recording what is pushed."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table, self.dim = table, table.shape[1]
        self.ctx = SimpleNamespace(device=torch.device("cpu"), rank=0, world_size=1)
        self.pulls: list[torch.Tensor] = []
        self.pushed = torch.zeros_like(table)

    def pull(self, keys: torch.Tensor) -> torch.Tensor:
        self.pulls.append(keys.clone())
        return self.table[keys].clone()

    def push(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        self.pushed.index_add_(0, keys, grads)  # duplicates summed, as the owners do


def _model(mode: str, arch: str = "attention") -> CTRModel:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, num_heads=2, mlp_dims=(8,), dense_buckets=0, bag_pooling=mode)
    return CTRModel(cfg, num_dense=2, num_fields=3, dim=D)


@pytest.mark.parametrize(
    ("mode", "arch", "l2"), [("mean", "attention", 0.0), ("sum", "attention", 0.3), ("mean", "dnn", 0.3)]
)
def test_a_training_step_pushes_the_row_gradients_of_the_plain_torch_reference(mode: str, arch: str, l2: float) -> None:
    torch.manual_seed(3)
    keys, lists = _random_batch(2)
    batch = Batch(labels=torch.tensor([1.0, 0, 1, 0, 0, 1]), dense=torch.rand(6, 2), keys=keys, bags=(_bags(lists),))
    table = torch.randn(V, D)

    ref_model, ref_table = _model(mode, arch), nn.Parameter(table.clone())
    emb = _reference_emb(ref_table, keys, lists, mode)
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

    model, sparse = _model(mode, arch), _TableSparse(table.clone())
    train_step(model, sparse, torch.optim.SGD(model.parameters(), lr=0.0), batch, step=1, embedding_l2=l2)  # type: ignore[arg-type]
    assert len(sparse.pulls) == 1  # the fixed keys and the bag keys in one pull
    assert set(sparse.pulls[0].tolist()) == set(keys[:, [0, 2]].reshape(-1).tolist()) | {
        k for x in lists for k in x
    } | {MISSING}
    torch.testing.assert_close(sparse.pushed, ref_table.grad, rtol=1e-5, atol=1e-7)
    for (name, p), ref in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, ref.grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")


def test_bag_pooling_none_trains_on_the_first_keys_as_before() -> None:
    keys, lists = _random_batch(4)
    batch = Batch(labels=torch.ones(6), dense=torch.rand(6, 2), keys=keys, bags=(_bags(lists),))
    sparse = _TableSparse(torch.randn(V, D))
    model = _model("none")
    train_step(model, sparse, torch.optim.SGD(model.parameters(), lr=0.0), batch, step=1)  # type: ignore[arg-type]
    assert sparse.pulls[0].tolist() == keys.reshape(-1).tolist()


# ---- reader ---------------------------------------------------------------------------------------


def _write_bag_features(root: Path, lists: list[list[int]], *, row_group: int = 5, parts: int = 2) -> Path:
    """A committed features dir: label numbers the rows, k_0 = 100 * row, k_1 = first of bag_1 (or -1)."""
    train = root / "train"
    train.mkdir(parents=True)
    n = len(lists)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        idx = np.arange(lo, hi)
        table = pa.table(
            {
                "label": idx.astype(np.float32),
                "d_0": idx.astype(np.float32),
                "k_0": (idx * 100).astype(np.int64),
                "k_1": np.array([x[0] if x else -1 for x in lists[lo:hi]], np.int64),
                "bag_1": pa.array(lists[lo:hi], type=pa.list_(pa.int64())),
            }
        )
        pq.write_table(table, train / f"part-{i:05d}.parquet", row_group_size=row_group)
    manifest = {
        "dense_columns": ["d_0"],
        "key_columns": ["k_0", "k_1"],
        "fields": ["site", "tags"],
        "bag_columns": ["bag_1"],
    }
    (root / "_SUCCESS.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.parametrize(("world", "batch_size"), [(1, 4), (2, 7), (3, 32)])
def test_the_reader_hands_each_rows_bag_over_as_flat_keys_and_offsets(
    tmp_path: Path, world: int, batch_size: int
) -> None:
    g = np.random.default_rng(0)
    lists = [[int(k) for k in g.integers(0, 1000, int(g.integers(0, 5)))] for _ in range(37)]
    root = _write_bag_features(tmp_path, lists)
    schema = read_schema(str(root))
    assert schema.bag_columns == ("bag_1",) and schema.bag_fields == (1,)
    for r in range(world):
        reader = RankReader(split_dir(str(root), "train"), schema, rank=r, world_size=world, batch_size=batch_size)
        for batch in reader.iter_batches():
            (bags,) = batch.bags
            assert bags.field == 1 and bags.offsets[0] == 0 and bags.offsets.numel() == len(batch) + 1
            for b, row in enumerate(batch.labels.long().tolist()):
                assert bags.values[bags.offsets[b] : bags.offsets[b + 1]].tolist() == lists[row]
    none = RankReader(split_dir(str(root), "train"), schema.for_pooling("none"), rank=0, world_size=1, batch_size=8)
    assert all(b.bags == () for b in none.iter_batches())


def test_a_bag_column_without_its_key_column_is_refused() -> None:
    with pytest.raises(ValueError, match=r"bag columns \['bag_2'\] have no key column"):
        FeatureSchema(dense_columns=(), key_columns=("k_0", "k_1"), fields=("a", "b"), bag_columns=("bag_2",))


def test_jagged_concat_and_slice_keep_the_rows() -> None:
    a = Jagged.from_arrow(pa.chunked_array([pa.array([[1, 2], None, [3]], type=pa.list_(pa.int64()))]))
    assert a.offsets.tolist() == [0, 2, 2, 3]  # a null list is an empty bag
    b = Jagged.from_arrow(pa.array([[], [4, 5, 6]], type=pa.list_(pa.int64())).slice(1))
    both = Jagged.concat([a, b])
    assert both.values.tolist() == [1, 2, 3, 4, 5, 6] and both.offsets.tolist() == [0, 2, 2, 3, 6]
    mid = both.slice(1, 4)
    assert mid.offsets.tolist() == [0, 0, 1, 4] and mid.values.tolist() == [3, 4, 5, 6]


# ---- evaluation -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["mean", "sum"])
def test_evaluation_scores_a_bag_model_with_its_bags_pooled_as_in_training(mode: str) -> None:
    keys, lists = _random_batch(5, B=9)
    table = torch.randn(V, D)
    model = _model(mode).eval()
    schema = FeatureSchema(
        dense_columns=("d_0", "d_1"), key_columns=("k_0", "k_1", "k_2"), fields=("a", "b", "c"), bag_columns=("bag_1",)
    )
    loaded = LoadedModel(
        model=model,
        embeddings=FrozenEmbeddings(np.arange(V), table.numpy(), dim=D, init_std=0.01),
        schema=schema,
        meta={},
    )
    dense = torch.rand(9, 2)
    frame = pd.DataFrame(
        {
            "d_0": dense[:, 0].numpy(),
            "d_1": dense[:, 1].numpy(),
            **{f"k_{f}": keys[:, f].numpy() for f in range(3)},
            "bag_1": [np.array(x, np.int64) for x in lists],
        }
    )
    with torch.no_grad():
        want = torch.sigmoid(model(dense, _reference_emb(nn.Parameter(table), keys, lists, mode))).double().numpy()
    np.testing.assert_allclose(score(loaded, frame, batch_size=4), want, rtol=1e-6)
    arrow_backed = frame.assign(
        bag_1=pd.Series(pa.array(lists, type=pa.list_(pa.int64())), dtype=pd.ArrowDtype(pa.list_(pa.int64())))
    )
    np.testing.assert_allclose(score(loaded, arrow_backed, batch_size=5), want, rtol=1e-6)
    with pytest.raises(KeyError, match=r"lack columns \['bag_1'\]"):
        score(loaded, frame.drop(columns=["bag_1"]))


# ---- 2 gloo ranks = 1 rank on the concatenated batches --------------------------------------------

STEPS, B_RANK = 3, 6


def _rank_batch(rank: int, step: int) -> Batch:
    keys, lists = _random_batch(1000 * step + rank, B=B_RANK)
    g = torch.Generator().manual_seed(step * 31 + rank)
    return Batch(
        labels=torch.randint(0, 2, (B_RANK,), generator=g).float(),
        dense=torch.rand(B_RANK, 2, generator=g),
        keys=keys,
        bags=(_bags(lists),),
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
    model = _model("mean")
    opt = KStepAdam(model.parameters(), ctx, k=1, lr=0.01)
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
            {"state": model.state_dict(), "keys": owned, "rows": store.lookup(owned).rows}, Path(out_dir) / f"r{rank}.pt"
        )
    finally:
        ctx.destroy()


@pytest.mark.distributed
def test_two_ranks_with_bags_train_what_one_rank_trains_on_the_concatenated_batches(
    tmp_path: Path, free_port: int
) -> None:
    run_ranks(_bag_rank, 2, free_port, str(tmp_path))
    model, store = _train(0, 1, init_distributed(cpu_trainer_config()))
    start = _model("mean").state_dict()
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
    assert not torch.equal(store.lookup(bag_keys).rows, MemoryStore(D, init_std=0.1).lookup(bag_keys).rows)  # bag rows trained
