"""Stochastic rounding: unbiased, onto a neighbour, with noise that depends only on key, clock, column and stream."""

from __future__ import annotations

import pytest
import torch

from storage.embedding.rows.rounding import round_to, uniform_bits


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour(dtype: torch.dtype) -> None:
    n = 40_000
    x = torch.full((n, 4), 0.10010001) * torch.tensor([1.0, -1.0, 3e-6, 1000.0])
    keys = torch.arange(n)
    r = round_to(x, dtype, keys, torch.ones(n, dtype=torch.int64)).float()
    lo, hi = torch.minimum(r.min(0).values, r.max(0).values), torch.maximum(r.min(0).values, r.max(0).values)
    near = x[0].to(dtype).float()
    for j in range(4):
        vals = torch.unique(r[:, j])
        assert vals.numel() == 2 and near[j] in vals, "only the two neighbours of x"
        assert lo[j] <= x[0, j] <= hi[j]
        err = (r[:, j].double().mean() - x[0, j].double()).abs()
        assert err < 3 * (hi[j] - lo[j]).double() / n**0.5, "zero error in expectation"
    exact = torch.tensor([[0.5, -2.0, 0.0, 1024.0]])
    assert torch.equal(round_to(exact, dtype, keys[:1], torch.ones(1)).float(), exact)


def test_rounding_noise_depends_only_on_key_clock_and_column() -> None:
    keys, clock = torch.tensor([5, 9, 5]), torch.tensor([1, 1, 2])
    u = uniform_bits(keys, clock, 8)
    assert torch.equal(u, uniform_bits(keys, clock, 8)) and ((u >= 0) & (u < 1)).all()
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    many = uniform_bits(torch.arange(100_000), torch.zeros(100_000), 4)
    assert abs(float(many.mean()) - 0.5) < 0.005 and abs(float(many.var()) - 1 / 12) < 0.002


def test_the_state_fields_round_with_noise_of_their_own() -> None:
    keys, clock = torch.arange(20_000), torch.ones(20_000)
    w, s1, s2 = (uniform_bits(keys, clock, 8, stream=s) for s in (0, 1, 2))
    for a, b in ((w, s1), (s1, s2)):
        assert abs(float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])) < 0.02
