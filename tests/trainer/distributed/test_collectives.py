"""Real gloo process groups: the two-phase allreduce equals the flat one; one rank sends nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.ranks import cpu_trainer_config, run_ranks
from trainer.distributed.collectives import (
    broadcast_tensors,
    flat_all_reduce,
    hierarchical_all_reduce,
)
from trainer.distributed.context import init_distributed


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(3, 5, generator=g), torch.randn(7, generator=g)


def _allreduce_rank(rank: int, world: int, out_dir: str) -> None:
    ctx = init_distributed(cpu_trainer_config(intra_group_size=2))  # 2 "nodes" x 2 ranks
    try:
        assert ctx.topology.groups == ((0, 1), (2, 3))
        assert ctx.topology.leaders == (0, 2)
        assert (ctx.intra_group is not None) and ((ctx.leader_group is not None) == (rank in (0, 2)))
        a, b = _inputs(rank)
        h = [a.clone(), b.clone()]
        f = [a.clone(), b.clone()]
        nbytes = hierarchical_all_reduce(h, ctx, op="avg")
        flat_all_reduce(f, ctx, op="avg")
        assert nbytes == (15 + 7) * 4
        for x, y in zip(h, f, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)
        s = [a.clone()]
        hierarchical_all_reduce(s, ctx, op="sum")
        c = [a.clone()]
        broadcast_tensors(c, ctx, src=3)
        torch.save({"avg": h, "sum": s, "bcast": c}, Path(out_dir) / f"r{rank}.pt")
    finally:
        ctx.destroy()


@pytest.mark.distributed
def test_hierarchical_equals_flat_allreduce_on_2_nodes_x_2(tmp_path: Path, free_port: int) -> None:
    run_ranks(_allreduce_rank, 4, free_port, str(tmp_path))
    results = [torch.load(tmp_path / f"r{r}.pt") for r in range(4)]
    inputs = [_inputs(r) for r in range(4)]
    want_a = torch.stack([i[0] for i in inputs]).mean(0)
    want_b = torch.stack([i[1] for i in inputs]).mean(0)
    for res in results:  # every rank holds the same, correct average
        torch.testing.assert_close(res["avg"][0], want_a, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res["avg"][1], want_b, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(res["sum"][0], want_a * 4, rtol=1e-5, atol=1e-5)
        assert torch.equal(res["bcast"][0], inputs[3][0])  # rank 3's values everywhere


def test_one_rank_reduces_nothing_and_keeps_its_values() -> None:
    ctx = init_distributed(cpu_trainer_config())
    t = [torch.arange(4.0)]
    assert hierarchical_all_reduce(t, ctx) == 0 and flat_all_reduce(t, ctx) == 0
    broadcast_tensors(t, ctx)
    torch.testing.assert_close(t[0], torch.arange(4.0))
    with pytest.raises(ValueError, match="op must be one of"):
        hierarchical_all_reduce(t, ctx, op="max")
