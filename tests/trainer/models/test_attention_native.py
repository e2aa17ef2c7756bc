"""The attention's compiled kernel is the plain formulation (values, gradients, dropout draws), is built once per shape
and machine, and gives way to the torch-ops kernel where it cannot be built."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer.models import attention_cpu, attention_native
from trainer.models.attention_cpu import attend
from trainer.models.ctr_model import plain_attention

from .test_attention_cpu import assert_seeded_dropout_is_the_plain_formulations

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) here to build the kernel")


@pytest.fixture(autouse=True)
def kernel_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test builds into its own cache, from an empty `kernel` memo."""
    monkeypatch.setenv("CTRPIPE_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("CTRPIPE_NATIVE_ATTENTION", raising=False)
    monkeypatch.delenv("CC", raising=False)
    attention_native.kernel.cache_clear()
    yield tmp_path / "kernels"
    attention_native.kernel.cache_clear()


@needs_cc
@pytest.mark.parametrize(
    ("batch", "tokens", "heads", "dim"), [(1, 3, 1, 4), (5, 26, 2, 16), (3, 39, 4, 16), (2, 17, 2, 8)]
)
def test_values_and_gradients_are_the_plain_formulations(batch: int, tokens: int, heads: int, dim: int) -> None:
    torch.manual_seed(0)
    qkv = torch.randn(batch, tokens, 3 * dim, requires_grad=True) * 2
    mine = attend(qkv, heads, 0.0)
    assert mine.grad_fn is not None and "NativeAttention" in type(mine.grad_fn).__name__  # the compiled kernel ran
    plain = plain_attention(qkv, heads, 0.0)
    torch.testing.assert_close(mine, plain, rtol=1e-5, atol=1e-6)
    g = torch.randn_like(mine)
    (mine_g,) = torch.autograd.grad(mine, qkv, g)
    (plain_g,) = torch.autograd.grad(plain, qkv, g)
    torch.testing.assert_close(mine_g, plain_g, rtol=1e-5, atol=1e-5)


@needs_cc
def test_a_seeded_dropout_drops_what_the_plain_formulation_drops() -> None:
    torch.manual_seed(0)
    qkv = torch.randn(9, 26, 48, requires_grad=True)
    assert_seeded_dropout_is_the_plain_formulations(qkv, 2, tol=1e-5)
    assert attention_native.kernel(26, 2, 8) is not None  # built: what `attend` ran above


@needs_cc
def test_large_scores_stay_finite_and_a_nan_input_comes_out_nan() -> None:
    """The softmax subtracts each row's maximum, as torch's does; a NaN is not hidden by the kernel's own exp."""
    qkv = torch.randn(2, 26, 48) * 60
    torch.testing.assert_close(attend(qkv.requires_grad_(), 2, 0.0), plain_attention(qkv, 2, 0.0), rtol=1e-4, atol=1e-4)
    bad = torch.randn(2, 26, 48)
    bad[0, 3, 5] = float("nan")
    out = attend(bad.requires_grad_(), 2, 0.0)
    assert out[0].isnan().any() and not out[1].isnan().any()


@needs_cc
def test_it_is_built_once_per_shape_into_the_cache(kernel_dir: Path) -> None:
    lib = attention_native.kernel(26, 2, 8)
    assert lib is not None
    (built,) = kernel_dir.glob("attention-26x2x8-*.so")
    stamp = built.stat().st_mtime_ns
    attention_native.kernel.cache_clear()  # a new process: it finds the build, does not build again
    assert attention_native.kernel(26, 2, 8) is not None and built.stat().st_mtime_ns == stamp
    assert attention_native.kernel(3, 1, 4) is not None and len(list(kernel_dir.glob("*.so"))) == 2
    assert not list(kernel_dir.glob("*.part"))


def test_without_a_compiler_training_runs_the_torch_ops_kernel(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-ctrpipe")
    qkv = torch.randn(4, 26, 48, requires_grad=True)
    with caplog.at_level(logging.WARNING, logger=attention_native.__name__):
        out = attend(qkv, 2, 0.0)
    assert "NativeAttention" not in type(out.grad_fn).__name__
    assert any("no C compiler (no-such-compiler-ctrpipe)" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(out, plain_attention(qkv, 2, 0.0), rtol=1e-5, atol=1e-6)


def test_a_failing_build_is_logged_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kernel_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = tmp_path / "broken-cc"
    broken.write_text(
        "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'broken-cc 1.0'; exit 0; }\n"  # it names itself,
        'for a; do case $a in *.part) echo partial > "$a";; esac; done\n'  # starts writing,
        "echo 'broken-cc: cannot compile' >&2\nexit 1\n"
    )  # and fails
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level(logging.WARNING, logger=attention_native.__name__):
        assert attention_native.kernel(26, 2, 8) is None
    assert any("failed" in r.getMessage() and "cannot compile" in r.getMessage() for r in caplog.records)
    assert not list(kernel_dir.glob("*"))  # no partial build left behind


def test_it_can_be_turned_off_and_is_not_built_for_long_sequences_or_outside_fp32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert attention_native.kernel(attention_native.MAX_TOKENS + 1, 2, 8) is None
    monkeypatch.setenv("CTRPIPE_NATIVE_ATTENTION", "0")
    assert attention_native.kernel(26, 2, 8) is None
    monkeypatch.delenv("CTRPIPE_NATIVE_ATTENTION")
    attention_native.kernel.cache_clear()
    with attention_cpu.torch_ops_kernel():  # bench.dense_step's comparison
        out = attend(torch.randn(2, 26, 48, requires_grad=True), 2, 0.0)
    assert "NativeAttention" not in type(out.grad_fn).__name__
    double = attend(torch.randn(2, 26, 48, dtype=torch.float64, requires_grad=True), 2, 0.0)
    assert "NativeAttention" not in type(double.grad_fn).__name__
