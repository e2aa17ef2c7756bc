"""The attention's compiled CPU kernel: `attention_native.c`, built for this machine on first use and called through
ctypes.

Why: the default model attends over 26 tokens with 8-wide heads, and in torch ops the attention ran at a few GFLOP/s
(its small batched products, a softmax over 26-wide rows, layout copies around them) where the model's other
matmuls run near the machine's rate.  The C file does one example and head at a time with every shape a
compile-time constant, so the compiler vectorises it for this CPU (`-march=native`) and keeps it in registers.

Why ctypes rather than `torch.utils.cpp_extension.load_inline` (the ecosystem's JIT path, ninja and its own build
lock): measured in the same alternating rounds (`python -m bench.dense_step --build`, docs/benchmarks.md), a cold
build takes 2.4 s here (0.5 s of compiler CPU) against load_inline's 254 s (33 s: torch's headers compile with each
build), a new process loads the cached build in 21 ms against 82 ms, and a call costs the same: 2.5 against 2.2 us
at batch 1, 2.34 against 2.18 ms per forward at batch 1,024 (7%, this shared machine's run-to-run spread; 0.2 ms of
a 63 ms step).  Every rank of a new node builds at the start of its first day, so the build decides it.

Building needs a C compiler (`$CC`, else `cc`).  The shared object is cached per user and machine in
`$CTRPIPE_KERNEL_DIR`, default `$XDG_CACHE_HOME/ctrpipe/kernels` (`~/.cache/ctrpipe/kernels`), named by a hash of the
source, the flags, the shapes, the compiler's version and this CPU's model and flags, so a cache shared between
machines never loads a build for another CPU.  Loading a shared object runs its code, so the cache is trusted only
when it is this user's own: the directory is created with mode 0700, and before anything is loaded from it `os.lstat`
must show a real directory (not a symlink) owned by this user and writable by nobody else, and the cached file a
regular file of this user's writable by nobody else; otherwise the process warns once, saying why and what to do, and
runs the torch-ops kernel.  A build goes to a `tempfile.mkstemp` file in the cache and is renamed into place, so ranks
that build at once never load a partial file; a cached file that does not load is rebuilt once.  Where no compiler or
build works, `kernel` returns None once with a warning in the log, and `trainer.models.attention_cpu` runs its
torch-ops kernel instead: the same values to float rounding, slower.  `CTRPIPE_NATIVE_ATTENTION=0` turns the kernel
off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["MAX_TOKENS", "NativeAttention", "kernel"]

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("attention_native.c")
FLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fopenmp-simd", "-shared", "-fPIC")
"""`-fno-trapping-math` lets the compiler vectorise the softmax's exp (its float-to-int rounding); nothing here reads
the floating-point exception flags."""
MAX_TOKENS = 64
"""The kernel holds one example and head's (T, T) weights on the stack: 16 KB at 64 tokens."""


def _cpu_id() -> str:
    """This CPU's model and feature flags (what `-march=native` compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in lines if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(dict.fromkeys(keep))  # the first of each (every core repeats them)


def _cache_dir() -> Path:
    """`$CTRPIPE_KERNEL_DIR`, else `ctrpipe/kernels` in the user's cache folder (`$XDG_CACHE_HOME` when it is an
    absolute path, as the XDG spec says, else `~/.cache`)."""
    if override := os.environ.get("CTRPIPE_KERNEL_DIR"):
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "ctrpipe" / "kernels"


def _untrusted(path: Path, *, directory: bool) -> str | None:
    """Why `path` (the cache directory, or a file in it) must not be loaded from, or None when it is this user's
    own: `os.lstat` (a symlink is refused, not followed) shows the right kind of entry, owned by this user, writable
    by no group or other user."""
    st = os.lstat(path)
    kind = "a directory" if directory else "a regular file"
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "something else"
        return f"{path} is {what}, not {kind}"
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


_warned: set[str] = set()
"""The refused cache directories this process has warned about (one warning each)."""


def _trusted_cache_dir() -> Path | None:
    """The kernel cache directory, created with mode 0700 if missing; None, with one warning saying why and what to
    do, when it is not this user's own (`_untrusted`)."""
    folder = _cache_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)  # an existing one is checked as it is
    why = _untrusted(folder, directory=True)
    if why is None:
        return folder
    if why not in _warned:
        _warned.add(why)
        log.warning(
            "not loading the attention's CPU kernel from its cache: %s; training runs the slower torch-ops kernel. "
            "Make it a directory of yours that only you can write (chmod 700), or set CTRPIPE_KERNEL_DIR to one",
            why,
        )
    return None


def _build(cc: str, defines: tuple[str, ...], out: Path) -> None:
    """Compile the kernel into a new file beside `out` (`mkstemp`: this user's, mode 0600, a name no one can
    guess), then rename it over `out`; a failed or killed build leaves nothing behind."""
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(  # noqa: S603 - the user's own compiler ($CC) on the package's source, no shell
            [cc, *FLAGS, *defines, "-o", tmp, str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        os.chmod(tmp, 0o700)  # the linker made a new file by the umask, which may let the group write it
        os.replace(tmp, out)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _load(cc: str, defines: tuple[str, ...], out: Path) -> ctypes.CDLL:
    """The cached build at `out`, built first when it is missing or not this user's own file; a file that does not
    load (a truncated or corrupt build) is rebuilt once."""
    if not out.exists() or _untrusted(out, directory=False) is not None:
        _build(cc, defines, out)
    try:
        return ctypes.CDLL(str(out))
    except OSError as exc:
        log.info("the cached attention kernel %s did not load (%s): building it again", out, exc)
    _build(cc, defines, out)
    return ctypes.CDLL(str(out))


@functools.cache
def kernel(tokens: int, heads: int, head_dim: int) -> ctypes.CDLL | None:
    """The built kernel for these shapes, or None where it cannot be built (the reason is logged once)."""
    if os.environ.get("CTRPIPE_NATIVE_ATTENTION", "1") == "0":
        return None
    if not 1 <= tokens <= MAX_TOKENS:
        return None
    cc = os.environ.get("CC") or "cc"
    if shutil.which(cc) is None:
        log.warning(
            "no C compiler (%s) to build the attention's CPU kernel: training runs the slower torch-ops "
            "kernel; install gcc or clang, or set CC",
            cc,
        )
        return None
    defines = (f"-DNT={tokens}", f"-DNH={heads}", f"-DNHD={head_dim}")
    try:
        folder = _trusted_cache_dir()
        if folder is None:
            return None
        version = subprocess.run(  # noqa: S603 - the user's own compiler ($CC), no shell
            [cc, "--version"], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        source = SOURCE.read_bytes()
        key = hashlib.sha256(
            b"\0".join(
                s.encode() if isinstance(s, str) else s for s in (source, " ".join(FLAGS + defines), version, _cpu_id())
            )
        ).hexdigest()[:20]
        lib = _load(cc, defines, folder / f"attention-{tokens}x{heads}x{head_dim}-{key}.so")
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        log.warning(
            "building the attention's CPU kernel with %s failed: training runs the slower torch-ops kernel (%s)",
            cc,
            str(detail).strip()[:500],
        )
        return None
    p, n = ctypes.c_void_p, ctypes.c_int64
    lib.attention_forward.argtypes = [p, p, p, p, n]
    lib.attention_forward.restype = None
    lib.attention_backward.argtypes = [p, p, p, p, p, n]
    lib.attention_backward.restype = None
    return lib


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class NativeAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(d)) v per (example, head) by the compiled kernel: qkv (B, T, 3D) -> (B, T, D).

    `keep_t` is the dropout's scaled mask on the weights laid out (B, H, T_key, T_query), or None.  The forward saves
    the softmax weights (B, H, T, T) for the backward, as the torch-ops kernel does.
    """

    @staticmethod
    def forward(ctx: Any, qkv: torch.Tensor, keep_t: torch.Tensor | None, heads: int, lib: ctypes.CDLL) -> torch.Tensor:
        qkv = qkv.contiguous()
        b, t, width = qkv.shape
        out = qkv.new_empty(b, t, width // 3)
        w = qkv.new_empty(b, heads, t, t)
        lib.attention_forward(_ptr(qkv), _ptr(keep_t), _ptr(out), _ptr(w), b)
        ctx.save_for_backward(qkv, keep_t, w)
        ctx.lib = lib
        return out

    @staticmethod
    def backward(ctx: Any, go: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        qkv, keep_t, w = ctx.saved_tensors
        go = go.contiguous()
        g = torch.empty_like(qkv)
        ctx.lib.attention_backward(_ptr(qkv), _ptr(keep_t), _ptr(w), _ptr(go), _ptr(g), qkv.shape[0])
        return g, None, None, None
