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


def test_seed_zero_keeps_the_bits_of_the_runs_before_the_seed_took_part() -> None:
    u = uniform_bits(torch.tensor([5, -9, 2**40 + 3]), torch.tensor([1, 1, 7]), 2, stream=1, seed=0)
    assert (u * (1 << 24)).to(torch.int64).tolist() == [[842009, 7431107], [775786, 14459688], [12195472, 4636221]]
    assert torch.equal(u, uniform_bits(torch.tensor([5, -9, 2**40 + 3]), torch.tensor([1, 1, 7]), 2, stream=1))


def test_each_seed_rounds_with_noise_of_its_own() -> None:
    keys, clock = torch.arange(20_000), torch.ones(20_000)
    by_seed = {s: uniform_bits(keys, clock, 8, seed=s) for s in (0, 1, 2, -1, 2**40)}
    assert all(torch.equal(u, uniform_bits(keys, clock, 8, seed=s)) for s, u in by_seed.items())
    pairs = [(a, b) for a in by_seed for b in by_seed if a < b]
    for a, b in pairs:
        assert abs(float(torch.corrcoef(torch.stack([by_seed[a].flatten(), by_seed[b].flatten()]))[0, 1])) < 0.02
    x = torch.full((4_000, 4), 0.10010001)
    one, two = (round_to(x, torch.float16, keys[:4_000], clock[:4_000], seed=s) for s in (1, 2))
    assert not torch.equal(one, two) and torch.equal(one, round_to(x, torch.float16, keys[:4_000], clock[:4_000], 1))


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_a_rows_noise_along_its_clock_has_no_serial_correlation(seed: int) -> None:
    """Lag-1 autocorrelation of one row's noise over 20,000 consecutive clocks, per column: for independent
    uniforms it is ~N(0, 1/n); the bound is 4.5 standard deviations per column (0.032) and for the mean of the 16
    columns (0.008).  The hash is deterministic, so the test is too."""
    n, dim = 20_000, 16
    clock = torch.arange(1, n + 1)
    for key in (0, 7, -5, 2**62 + 3):
        u = uniform_bits(torch.full((n,), key), clock, dim, seed=seed) - 0.5
        lag1 = (u[1:] * u[:-1]).sum(0) / (u * u).sum(0)
        assert float(lag1.abs().max()) < 4.5 / n**0.5, (key, lag1)
        assert abs(float(lag1.mean())) < 4.5 / (n * dim) ** 0.5, (key, lag1)
        assert abs(float(u.mean())) < 4.5 * (1 / 12 / (n * dim)) ** 0.5  # and uniform around 1/2
