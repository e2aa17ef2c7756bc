"""The attention's compiled CPU kernel: `attention_native.c`, built for this machine on first use and called through
ctypes.

Why: the default model attends over 26 tokens with 8-wide heads, and in torch ops the attention ran at a few GFLOP/s
(its small batched products, a softmax over 26-wide rows, layout copies around them) where the model's other
matmuls run near the machine's rate.  The C file does one example and head at a time with every shape a
compile-time constant, so the compiler vectorises it for this CPU (`-march=native`) and keeps it in registers.

Building needs a C compiler (`$CC`, else `cc`); the shared object is cached under `$CTRPIPE_KERNEL_DIR` (default:
`ctrpipe-kernels-<uid>` in the temp dir), named by a hash of the source, the flags, the shapes, the compiler's version
and
this CPU's model and flags, so a cache shared between machines never loads a build for another CPU.  Ranks that build
at once each write their own file and rename it into place.  Where no compiler or build works, `kernel` returns None
once with a warning in the log, and `trainer.models.attention_cpu` runs its torch-ops kernel instead: the same values to
float rounding, slower.  `CTRPIPE_NATIVE_ATTENTION=0` turns the kernel off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
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
    """`$CTRPIPE_KERNEL_DIR`, else one per user in the temp dir (another user's builds are not this one's to load)."""
    user = getattr(os, "getuid", lambda: "")()
    return Path(os.environ.get("CTRPIPE_KERNEL_DIR") or Path(tempfile.gettempdir()) / f"ctrpipe-kernels-{user}")


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
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
        source = SOURCE.read_bytes()
        key = hashlib.sha256(
            b"\0".join(
                s.encode() if isinstance(s, str) else s for s in (source, " ".join(FLAGS + defines), version, _cpu_id())
            )
        ).hexdigest()[:20]
        out = _cache_dir() / f"attention-{tokens}x{heads}x{head_dim}-{key}.so"
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(f"{out.name}.{os.getpid()}.part")
            try:
                subprocess.run(
                    [cc, *FLAGS, *defines, "-o", str(part), str(SOURCE), "-lm"],
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=300,
                )
                os.replace(part, out)
            finally:
                part.unlink(missing_ok=True)  # a failed or killed build leaves no partial file behind
        lib = ctypes.CDLL(str(out))
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
