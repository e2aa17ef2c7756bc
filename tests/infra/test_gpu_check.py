"""`make gpu-check` (infra/gpu-check.sh): valid bash, and everything it runs exists in the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "gpu-check.sh"


@pytest.mark.subprocess  # bash -n
def test_the_gpu_check_is_valid_bash_run_by_make() -> None:
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    assert re.search(r"^gpu-check:\n\tbash infra/gpu-check\.sh$", (REPO / "Makefile").read_text(), flags=re.MULTILINE)


def test_what_the_gpu_check_runs_exists() -> None:
    text = SCRIPT.read_text()
    tests = re.findall(r"tests/[\w/]+\.py", text)
    assert tests and all((REPO / t).is_file() for t in tests), tests
    modules = re.findall(r"-m (bench\.\w+)", text)
    assert modules == ["bench.gpu_probe"] and (REPO / "bench" / "gpu_probe.py").is_file()
    assert "--system-site-packages" in text and "--no-index --find-links" in text, (
        "installs over the host's torch, offline"
    )
