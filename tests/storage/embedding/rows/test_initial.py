"""init_rows: deterministic, distribution-sane, identical to the NumPy uint64 reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.embedding.rows.initial import init_rows, splitmix64

# splitmix64's published constants (Steele, Lea, Flood 2014), independent of the module under test.
_GAMMA, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def init_rows_numpy(keys: np.ndarray, dim: int, std: float) -> np.ndarray:
    """`init_rows` as the module docstring specifies it, in NumPy uint64 arithmetic."""
    u = np.asarray(keys, dtype=np.int64).view(np.uint64)

    def mix(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            z = x + np.uint64(_GAMMA)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
            return z ^ (z >> np.uint64(31))

    with np.errstate(over="ignore"):
        steps = np.arange(dim, dtype=np.uint64) * np.uint64(_GAMMA)
        h = mix(mix(u)[:, None] + steps[None, :])
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 1.0) * (1.0 / 2**32)
    u2 = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 2**32)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return (z * std).astype(np.float32)


def test_matches_numpy_reference_bit_for_bit() -> None:
    keys = torch.cat([torch.randint(0, 2**62, (20000,)), torch.tensor([0, 1, 2, 2**63 - 1, 5 << 56])])
    np.testing.assert_array_equal(init_rows(keys, 16, 0.01).numpy(), init_rows_numpy(keys.numpy(), 16, 0.01))


def test_splitmix64_known_values() -> None:
    # splitmix64 stream of seed 0: first outputs are the published test vectors.
    state = torch.tensor([0], dtype=torch.int64)
    out = splitmix64(state).view(torch.int64).item() & (2**64 - 1)
    assert out == 0xE220A8397B1DCDAF


def test_a_row_depends_on_its_key_alone() -> None:
    keys = torch.tensor([7, 3, 7, 2**60], dtype=torch.int64)
    a = init_rows(keys, 8, 0.1)
    b = init_rows(keys.flip(0), 8, 0.1).flip(0)
    assert torch.equal(a, b)
    assert torch.equal(a[0], a[2])
    assert not torch.equal(a[0], a[1])
    # column j does not depend on dim; std only scales
    assert torch.equal(init_rows(keys, 4, 0.1), a[:, :4])
    torch.testing.assert_close(init_rows(keys, 8, 0.2), a * 2)


def test_rows_are_normal_with_the_given_std_and_uncorrelated() -> None:
    rows = init_rows(torch.arange(50000, dtype=torch.int64), 8, 0.5)
    assert rows.dtype == torch.float32
    assert abs(rows.mean().item()) < 0.01
    assert abs(rows.std().item() - 0.5) < 0.01
    assert torch.isfinite(rows).all()
    # neighbouring keys and fields are uncorrelated
    c = torch.corrcoef(torch.stack([rows[:-1, 0], rows[1:, 0], rows[:-1, 1]]))
    assert c[0, 1].abs() < 0.03 and c[0, 2].abs() < 0.03


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError):
        init_rows(torch.tensor([1], dtype=torch.int32), 4, 0.1)
    with pytest.raises(ValueError):
        init_rows(torch.tensor([[1]]), 4, 0.1)
    with pytest.raises(ValueError):
        init_rows(torch.tensor([1]), 0, 0.1)
    with pytest.raises(ValueError):
        init_rows(torch.tensor([1]), 4, 0.0)
    assert init_rows(torch.empty(0, dtype=torch.int64), 4, 0.1).shape == (0, 4)
