"""The GPU probe's code runs on CPU (a dry run): CUDA-only sections say they were skipped, the others report."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu_probe import run_probe, section_determinism


def test_the_probe_dry_runs_on_cpu_and_writes_each_section(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    res = run_probe("cpu", str(out), sections=["world", "nccl", "restore_memory"])
    assert res["world"]["status"] == "ok" and res["world"]["auto"] == 1
    assert res["world"]["too_many_nccl_ranks"].startswith("refused: trainer.nproc_per_node=2")
    assert res["nccl"]["status"] == res["restore_memory"]["status"] == "skipped: no CUDA"
    assert json.loads(out.read_text()) == json.loads(json.dumps(res, default=str))


def test_two_cpu_runs_are_bitwise_equal_with_and_without_deterministic() -> None:
    res = section_determinism("cpu", steps=2)
    for mode in ("default", "deterministic"):
        assert res[mode]["losses_equal"] and res[mode]["dense_bitwise_equal"] and res[mode]["rows_bitwise_equal"], res
