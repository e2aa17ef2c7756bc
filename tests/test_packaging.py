"""Packaging: torch is a range a CUDA host's own build satisfies, the CPU pin lives in the constraints
`make` uses, and the runtime code names no torch API newer than the range's lower bound.

torch older than the bound cannot be installed here (a few GB per build), so the bound is checked by
reasoning once and by this test ever after: every torch name the runtime packages use is in
`REVIEWED`, each checked to exist in torch {LOWER} (the newest of them: `torch.amp.GradScaler` with a
device argument and `init_process_group(device_id=...)`, both from 2.3; numpy 2 support from 2.3).  A
name outside it fails the test until someone checks it against the bound and adds it.  Methods of
tensors and keyword arguments are not seen by it; those used are as old as 2.3 too.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOWER = "2.4"
RUNTIME = ("flows", "pipeline", "trainer", "storage")
ALIASES = {"dist": "torch.distributed", "F": "torch.nn.functional", "nn": "torch.nn"}
REVIEWED = frozenset(
    {
        # serving export and evaluate: torch.export (export/load/save/Dim/ExportedProgram) is in 2.4; torch.onnx.export
        # with dynamo=True needs 2.5, and only the optional `onnx` extra reaches it (trainer/export.py says so)
        "torch.export",
        "torch.export.Dim",
        "torch.export.ExportedProgram",
        "torch.export.export",
        "torch.export.load",
        "torch.export.save",
        "torch.get_num_threads",
        "torch.inference_mode",
        "torch.onnx.export",
        "torch.rand",
        "torch.Tensor",
        "torch.amp.GradScaler",
        "torch.arange",
        "torch.are_deterministic_algorithms_enabled",
        "torch.argsort",
        "torch.autocast",
        "torch.bfloat16",
        "torch.bincount",
        "torch.bitwise_right_shift",
        "torch.bool",
        "torch.bucketize",
        "torch.cat",
        "torch.cuda.Event",
        "torch.cuda.Stream",
        "torch.cuda.current_stream",
        "torch.cuda.device",
        "torch.cuda.device_count",
        "torch.cuda.get_device_properties",
        "torch.cuda.get_rng_state",
        "torch.cuda.is_available",
        "torch.cuda.nccl.version",
        "torch.cuda.set_device",
        "torch.cuda.set_rng_state",
        "torch.cuda.stream",
        "torch.cumsum",
        "torch.device",
        "torch.distributed",
        "torch.dtype",
        "torch.iinfo",
        "torch.int16",
        "torch.int32",  # compact rows (storage.embedding.rows.format): basic since 1.x
        "torch.sparse_csr_tensor",  # the companion's Poly2 fit (trainer.companion.poly2): check_invariants= since 2.0
        "torch.distributed.PrefixStore",
        "torch.distributed.ProcessGroup",
        "torch.distributed.ReduceOp.SUM",
        "torch.distributed.all_gather_object",
        "torch.distributed.all_reduce",
        "torch.distributed.all_to_all_single",
        "torch.distributed.barrier",
        "torch.distributed.broadcast",
        "torch.distributed.broadcast_object_list",
        "torch.distributed.destroy_process_group",
        "torch.distributed.init_process_group",
        "torch.distributed.is_initialized",
        "torch.distributed.is_nccl_available",
        "torch.distributed.new_group",
        "torch.distributed.reduce",
        "torch.distributed.rendezvous",
        "torch.distributed.run",
        "torch.empty",
        "torch.empty_like",
        "torch.equal",
        "torch.float16",
        "torch.float32",
        "torch.float64",
        "torch.from_numpy",
        "torch.full",
        "torch.full_like",
        "torch.get_rng_state",
        "torch.index_select",
        "torch.int64",
        "torch.isfinite",
        "torch.lerp",
        "torch.linspace",
        "torch.manual_seed",
        "torch.nan_to_num",
        "torch.nn.Dropout",
        "torch.nn.Embedding",
        "torch.nn.EmbeddingBag",
        "torch.nn.LayerNorm",
        "torch.nn.Linear",
        "torch.nn.Module",
        "torch.nn.ModuleList",
        "torch.nn.MultiheadAttention",
        "torch.nn.Parameter",
        "torch.nn.ReLU",
        "torch.nn.Sequential",
        "torch.nn.functional",
        "torch.nn.functional.binary_cross_entropy_with_logits",
        "torch.nn.init.normal_",
        "torch.nn.init.zeros_",
        "torch.no_grad",
        "torch.nonzero",
        "torch.ones",
        "torch.optim.Adam",
        "torch.pow",
        "torch.preserve_format",
        "torch.randn",
        "torch.repeat_interleave",
        "torch.random.fork_rng",  # the cross term's initial values (trainer.models.ctr_model): in torch since 0.4.1
        "torch.searchsorted",
        "torch.set_num_threads",
        "torch.set_rng_state",
        "torch.sigmoid",
        "torch.sqrt",
        "torch.stack",
        "torch.tensor",
        "torch.unique",
        "torch.use_deterministic_algorithms",
        "torch.where",
        "torch.zeros",
        "torch.zeros_like",
        # int8 rows and log8 state (storage.embedding.rows.quantize): basic since 1.x
        # (Tensor.nextafter and amin/amax 1.7)
        "torch.exp2",
        "torch.floor",
        "torch.inf",
        "torch.log2",
        "torch.uint8",
        # self-attention in plain matmuls (trainer.models.ctr_model.self_attention): basic since 1.x
        "torch.matmul",
        "torch.nn.functional.dropout",
        "torch.nn.functional.linear",
        # the MLP's first layer on column blocks (trainer.models.layers.concat_linear): addmm since 1.x,
        # is_autocast_enabled(device_type) since 2.4 (the device-agnostic autocast API)
        "torch.addmm",
        "torch.is_autocast_enabled",
        # the CPU attention kernel (trainer.models.attention_cpu): autograd.Function, bmm and is_grad_enabled since
        # 1.x, softmax's out= variant (softmax.int_out) since 1.12
        "torch.autograd.Function",
        "torch.bmm",
        "torch.is_grad_enabled",
        "torch.softmax",
        # the device cache's auto size (storage.embedding.tiered): cuda.mem_get_info since 1.10
        "torch.cuda.mem_get_info",
        # the modules a process's first torch.export imports (trainer.export.FIRST_EXPORT_IMPORTS, preloaded by
        # flows.day.preload): both exist in 2.4 (_dynamo since 2.0, export._trace since 2.2)
        "torch._dynamo",
        "torch.export._trace",
        # the dense Adam (trainer.optim.fused_adam): the op torch.optim.Adam(fused=True) calls, on CPU since 2.4; the
        # foreach ops it calls around it since 1.x
        "torch._fused_adam_",
        "torch._foreach_add_",
        "torch._foreach_sub_",
        "torch._foreach_zero_",
        # the companion's design (trainer.companion.poly2): sort(stable=) since 1.9
        "torch.sort",
        # named in attention_native's docstring as the build path it does not take; cpp_extension since 1.x
        "torch.utils.cpp_extension.load_inline",
    }
)
"""The torch names the runtime code uses, each present in torch {LOWER}."""


def torch_names(paths: list[Path]) -> set[str]:
    """Dotted torch names in the sources (`torch.x.y`, and `dist.x` / `F.x` / `nn.x` where so imported)."""
    found: set[str] = set()
    for p in paths:
        src = p.read_text()
        found |= set(re.findall(r"\btorch(?:\.[A-Za-z_]\w*)+", src))
        for alias, full in ALIASES.items():
            parent, leaf = full.rsplit(".", 1)
            if re.search(
                rf"^\s*(import {re.escape(full)} as {alias}|from {re.escape(parent)} import {leaf}( as {alias})?)\s*$",
                src,
                re.M,
            ):
                found |= {full + m for m in re.findall(rf"(?<![\w.]){alias}((?:\.[A-Za-z_]\w*)+)", src)}
    return found


def test_torch_is_a_range_whose_lower_bound_is_the_reviewed_one() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    torch = next(Requirement(d) for d in deps if Requirement(d).name == "torch")
    assert Version(LOWER) in torch.specifier and Version("2.11.0+cu130") in torch.specifier
    assert not torch.specifier.contains(str(Version(LOWER).major) + "." + str(Version(LOWER).minor - 1))


def test_the_dev_machines_install_the_exact_cpu_torch() -> None:
    pins = [ln.strip() for ln in (REPO / "constraints-cpu.txt").read_text().splitlines() if ln.strip()[:1].isalpha()]
    assert pins == ["torch==2.13.0"]
    assert "-c $(CONSTRAINTS)" in (REPO / "Makefile").read_text()


def test_the_runtime_uses_no_torch_api_beyond_the_reviewed_ones() -> None:
    used = torch_names([p for pkg in RUNTIME for p in (REPO / pkg).rglob("*.py")])
    new = sorted(used - REVIEWED)
    assert not new, f"torch names not yet checked against torch >= {LOWER} (pyproject.toml): {new}"
    assert "torch.amp.GradScaler" in used, "the scan sees the runtime's torch names"
