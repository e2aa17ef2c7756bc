"""The attention's compiled kernel is the plain formulation (values, gradients, dropout draws), is built once per shape
and machine into a cache only this user can write, is never loaded from a cache another user could have written, and
gives way to the torch-ops kernel where it cannot be built."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
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
    """Each test builds into its own cache, from an empty `kernel` memo and no warning given yet."""
    monkeypatch.setenv("CTRPIPE_KERNEL_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("CTRPIPE_NATIVE_ATTENTION", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(attention_native, "_warned", set())
    attention_native.kernel.cache_clear()
    yield tmp_path / "kernels"
    attention_native.kernel.cache_clear()


def planted_library(path: Path, canary: Path) -> None:
    """A shared object at `path` that creates `canary` when it is loaded (its constructor runs on dlopen)."""
    source = path.with_name("planted.c")
    source.write_text(
        f'#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{ FILE *f = fopen("{canary}", '
        '"w"); if (f) fclose(f); }\n'
    )
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(source)], check=True)
    source.unlink()


def built_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: tuple[int, int, int] = (26, 2, 8)) -> str:
    """The file name the kernel of `shape` has in any cache on this machine (built once in a cache of its own)."""
    monkeypatch.setenv("CTRPIPE_KERNEL_DIR", str(tmp_path / "reference"))
    assert attention_native.kernel(*shape) is not None
    attention_native.kernel.cache_clear()
    (built,) = (tmp_path / "reference").glob("attention-{}x{}x{}-*.so".format(*shape))
    return built.name


def refused(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "not loading the attention's CPU kernel" in r.getMessage()]


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
    assert kernel_dir.stat().st_mode & 0o777 == 0o700  # created for this user alone
    (built,) = kernel_dir.glob("attention-26x2x8-*.so")
    assert built.stat().st_mode & 0o077 == 0  # whatever the umask made of the linker's file
    stamp = built.stat().st_mtime_ns
    attention_native.kernel.cache_clear()  # a new process: it finds the build, does not build again
    assert attention_native.kernel(26, 2, 8) is not None and built.stat().st_mtime_ns == stamp
    assert attention_native.kernel(3, 1, 4) is not None and len(list(kernel_dir.glob("*.so"))) == 2
    assert sorted(p.name for p in kernel_dir.iterdir()) == sorted(p.name for p in kernel_dir.glob("*.so"))  # no temp


@needs_cc
def test_the_default_cache_is_the_users_own_under_xdg_cache_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CTRPIPE_KERNEL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert attention_native.kernel(26, 2, 8) is not None
    cache = tmp_path / "xdg" / "ctrpipe" / "kernels"
    assert len(list(cache.glob("attention-26x2x8-*.so"))) == 1 and cache.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert attention_native._cache_dir() == tmp_path / "home" / ".cache" / "ctrpipe" / "kernels"


@needs_cc
@pytest.mark.subprocess  # the planted library is compiled by the test
@pytest.mark.parametrize("unsafe", ["world-writable", "group-writable", "a symlink", "another user's"])
def test_a_cache_another_user_could_write_is_never_loaded_from(
    unsafe: str, tmp_path: Path, kernel_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A planted build under the very name the kernel would load is not loaded: the process warns once why and
    what to do, and trains with the torch-ops kernel."""
    name = built_name(tmp_path, monkeypatch)
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    canary = tmp_path / "loaded"
    planted_library(planted / name, canary)
    expected = {
        "world-writable": "writable by other users (mode 0777)",
        "group-writable": "writable by other users (mode 0770)",
        "a symlink": "is a symlink, not a directory",
        "another user's": "not by this user",
    }[unsafe]
    cache = planted
    if unsafe == "world-writable":
        planted.chmod(0o777)
    elif unsafe == "group-writable":
        planted.chmod(0o770)
    elif unsafe == "a symlink":
        cache = tmp_path / "link"
        cache.symlink_to(planted)  # the directory itself is this user's and 0700: the link is what is refused
    else:  # what a directory of another uid looks like from here (no second user needed)
        uid = os.getuid()
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    monkeypatch.setenv("CTRPIPE_KERNEL_DIR", str(cache))
    with caplog.at_level(logging.WARNING, logger=attention_native.__name__):
        assert attention_native.kernel(26, 2, 8) is None
        assert attention_native.kernel(3, 1, 4) is None  # another shape: no second warning
        qkv = torch.randn(2, 26, 48, requires_grad=True)
        out = attend(qkv, 2, 0.0)
    assert not canary.exists()  # the planted library never ran
    assert "NativeAttention" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, plain_attention(qkv, 2, 0.0), rtol=1e-5, atol=1e-6)
    (message,) = refused(caplog)
    assert expected in message and str(cache) in message and "CTRPIPE_KERNEL_DIR" in message and "chmod 700" in message
    assert sorted(p.name for p in planted.iterdir()) == [name]  # nothing built there either


@needs_cc
@pytest.mark.subprocess  # the planted library is compiled by the test
def test_a_planted_file_in_the_users_cache_that_is_not_its_own_build_is_replaced(
    tmp_path: Path, kernel_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a cache of this user's, a cached file others could write (or a symlink) is rebuilt, not loaded."""
    names = [built_name(tmp_path, monkeypatch, shape) for shape in ((26, 2, 8), (3, 1, 4))]
    monkeypatch.setenv("CTRPIPE_KERNEL_DIR", str(kernel_dir))
    kernel_dir.mkdir(mode=0o700)
    canary = tmp_path / "loaded"
    planted_library(tmp_path / "planted.so", canary)
    (kernel_dir / names[0]).symlink_to(tmp_path / "planted.so")
    planted_library(kernel_dir / names[1], canary)
    (kernel_dir / names[1]).chmod(0o666)
    assert attention_native.kernel(26, 2, 8) is not None and attention_native.kernel(3, 1, 4) is not None
    assert not canary.exists()
    assert not (kernel_dir / names[0]).is_symlink() and (kernel_dir / names[1]).stat().st_mode & 0o077 == 0


@needs_cc
def test_a_cached_file_that_does_not_load_is_rebuilt_once(
    tmp_path: Path, kernel_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    name = built_name(tmp_path, monkeypatch)
    monkeypatch.setenv("CTRPIPE_KERNEL_DIR", str(kernel_dir))
    kernel_dir.mkdir(mode=0o700)
    (kernel_dir / name).write_bytes(b"not a shared object")  # a truncated or corrupt build, the user's own file
    (kernel_dir / name).chmod(0o700)
    with caplog.at_level(logging.INFO, logger=attention_native.__name__):
        assert attention_native.kernel(26, 2, 8) is not None
    assert (kernel_dir / name).read_bytes()[:4] == b"\x7fELF"
    assert any("did not load" in r.getMessage() and "building it again" in r.getMessage() for r in caplog.records)
    qkv = torch.randn(2, 26, 48, requires_grad=True)
    out = attend(qkv, 2, 0.0)
    assert "NativeAttention" in type(out.grad_fn).__name__
    torch.testing.assert_close(out, plain_attention(qkv, 2, 0.0), rtol=1e-5, atol=1e-6)


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
        'for a; do case $a in *.tmp) echo partial > "$a";; esac; done\n'  # starts writing,
        "echo 'broken-cc: cannot compile' >&2\nexit 1\n"
    )  # and fails
    broken.chmod(0o755)
    monkeypatch.setenv("CC", str(broken))
    with caplog.at_level(logging.WARNING, logger=attention_native.__name__):
        assert attention_native.kernel(26, 2, 8) is None
    assert any("failed" in r.getMessage() and "cannot compile" in r.getMessage() for r in caplog.records)
    assert os.listdir(kernel_dir) == []  # no partial build left behind (nor a hidden temp file)


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
