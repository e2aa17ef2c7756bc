"""The attention kernel's two ways to be built and called, in the same rounds: this project's ctypes build
(`trainer.models.attention_native`: `cc` on the C file, `ctypes.CDLL`) and torch's JIT extension path,
`torch.utils.cpp_extension.load_inline` (the same C source compiled as C++ with a pybind11 binding, ninja, and
torch's own build lock).  `python -m bench.dense_step --build [--rounds 3]`.

Each round measures, for both, in alternating order:

- cold build: a first use in an empty cache (ctypes: the compiler's version, the hash, the compile, the load;
  load_inline: the sources written, ninja, compile and link, the import), in wall seconds and in the CPU seconds
  of the compiler processes (what a shared machine's other load does not move);
- warm load: a new process's first use with the build cached (ctypes: the compiler's version and the hash, then
  `dlopen`; load_inline: ninja's up-to-date check, then the import), timed inside that process, after torch is
  imported;
- per call: the forward on preallocated tensors at the model's shapes (26 tokens, 2 heads of 8; batch 1, where
  the binding's own cost shows, and the recipe's batches 128 and 1,024), CPU microseconds of this process.

The table gives medians over the rounds.  The machine is shared with other work: the rounds alternate the two
paths so that a load spike falls on both, and the compiler CPU seconds are the build's cost without the wait.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.models import attention_native

REPO = Path(__file__).resolve().parents[1]
SHAPE = (26, 2, 8)
"""(tokens, heads, head width) of the default model."""
BATCHES = (1, 128, 1024)
_BINDING = r"""
void forward(const torch::Tensor& qkv, const c10::optional<torch::Tensor>& keep_t, torch::Tensor& out,
             torch::Tensor& w) {
    attention_forward(qkv.data_ptr<float>(), keep_t ? keep_t->data_ptr<float>() : nullptr, out.data_ptr<float>(),
                      w.data_ptr<float>(), qkv.size(0));
}
"""


def inline_source() -> str:
    """The C file as one C++ translation unit (`restrict` spelled as g++ takes it) with a torch binding."""
    c = attention_native.SOURCE.read_text()
    head = '#define restrict __restrict__\nextern "C" {\n'
    return f"{head}{c}\n}}\n#undef restrict\n#include <torch/extension.h>\n{_BINDING}"


def inline_flags() -> list[str]:
    t, h, d = SHAPE
    flags = [f for f in attention_native.FLAGS if f not in ("-shared", "-fPIC")]  # load_inline links the module
    return [*flags, f"-DNT={t}", f"-DNH={h}", f"-DNHD={d}"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """(fn(), wall seconds, CPU seconds of the processes it waited for)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, _children_cpu() - cpu0


def cold_ctypes(folder: str) -> tuple[Any, float, float]:
    os.environ["CTRPIPE_KERNEL_DIR"] = folder
    attention_native.kernel.cache_clear()
    try:
        return _timed(lambda: attention_native.kernel(*SHAPE))
    finally:
        attention_native.kernel.cache_clear()


def cold_inline(folder: str, name: str) -> tuple[Any, float, float]:
    from torch.utils.cpp_extension import load_inline

    return _timed(
        lambda: load_inline(
            name,
            cpp_sources=[inline_source()],
            functions=["forward"],
            extra_cflags=inline_flags(),
            build_directory=folder,
            verbose=False,
        )
    )


_WARM = {
    "ctypes": "from trainer.models.attention_native import kernel\nt0 = time.perf_counter()\nassert kernel(26, 2, 8)\n",
    "inline": (
        "from torch.utils.cpp_extension import load_inline\nfrom bench._kernel_build import inline_flags, "
        "inline_source\nsrc, flags = inline_source(), inline_flags()\nt0 = time.perf_counter()\n"
        "load_inline(sys.argv[2], cpp_sources=[src], functions=['forward'], extra_cflags=flags, "
        "build_directory=sys.argv[1])\n"
    ),
}


def warm_load(kind: str, folder: str, name: str) -> float:
    """Seconds a new process takes to have the cached build callable (after `import torch`)."""
    code = "import sys, time, torch\n" + _WARM[kind] + "print(time.perf_counter() - t0)\n"
    env = {**os.environ, "CTRPIPE_KERNEL_DIR": folder, "PYTHONPATH": str(REPO)}
    out = subprocess.run(  # noqa: S603 - this interpreter on the code above
        [sys.executable, "-c", code, folder, name], capture_output=True, text=True, check=True, env=env, timeout=600
    )
    return float(out.stdout.strip().splitlines()[-1])


def per_call_us(call: Callable[[], None], budget_s: float = 0.2) -> float:
    """CPU microseconds per call, over as many calls as fit `budget_s` (after one warm-up call)."""
    call()
    n, chunk, t0 = 0, 1, time.process_time()
    while (spent := time.process_time() - t0) < budget_s:
        for _ in range(chunk):
            call()
        n += chunk
        chunk = min(chunk * 2, 4096)
    return spent / n * 1e6


def calls(lib: Any, module: Any, batch: int) -> dict[str, Callable[[], None]]:
    t, h, d = SHAPE
    torch.manual_seed(0)
    qkv = torch.randn(batch, t, 3 * h * d)
    out, w = torch.empty(batch, t, h * d), torch.empty(batch, h, t, t)
    q, o, ww = qkv.data_ptr(), out.data_ptr(), w.data_ptr()
    return {
        "ctypes": lambda: lib.attention_forward(q, None, o, ww, batch),
        "inline": lambda: module.forward(qkv, None, out, w),
    }


def measure(rounds: int) -> list[dict[str, Any]]:
    """Per path: the medians over `rounds` of the cold build, the warm load and the per-call times."""
    got: dict[str, dict[str, list[float]]] = {k: {} for k in ("ctypes", "inline")}

    def note(kind: str, key: str, value: float) -> None:
        got[kind].setdefault(key, []).append(value)

    root = tempfile.mkdtemp(prefix="kernel-build-", dir=os.environ.get("TMPDIR"))
    for r in range(rounds):
        built: dict[str, Any] = {}
        for kind in ("ctypes", "inline") if r % 2 == 0 else ("inline", "ctypes"):
            folder = os.path.join(root, f"{kind}-{r}")
            os.makedirs(folder, mode=0o700)
            name = f"attention_inline_{os.getpid()}_{r}"
            lib, wall, cpu = cold_ctypes(folder) if kind == "ctypes" else cold_inline(folder, name)
            built[kind] = lib
            note(kind, "cold_build_s", wall)
            note(kind, "cold_build_cpu_s", cpu)
            note(kind, "warm_load_ms", warm_load(kind, folder, name) * 1e3)
        for b in BATCHES:
            fns = calls(built["ctypes"], built["inline"], b)
            for kind in fns if r % 2 == 0 else reversed(list(fns)):
                note(kind, f"call_us_b{b}", per_call_us(fns[kind]))
    labels = {"ctypes": "ctypes (attention_native, kept)", "inline": "torch cpp_extension.load_inline"}
    return [{"run": labels[k], **{key: round(statistics.median(v), 4) for key, v in got[k].items()}} for k in got]
