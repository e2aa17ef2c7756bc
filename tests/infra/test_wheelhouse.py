"""`make wheelhouse`: every runtime dependency but torch, read from pyproject.toml, as wheels for another Python."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infra.wheelhouse import (
    build_requirements,
    download_command,
    requirement_name,
    runtime_requirements,
)

PYPROJECT = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()


def test_the_wheelhouse_holds_every_runtime_requirement_but_torch() -> None:
    reqs = runtime_requirements(PYPROJECT)
    names = {requirement_name(r) for r in reqs}
    assert "torch" not in names, "the GPU host brings its own CUDA torch"
    assert {"prefect", "dask", "pyarrow", "isal", "safetensors", "numpy"} <= names
    assert "dask[dataframe,distributed]>=2025.1,<2027" in reqs, "extras and bounds are kept"
    assert "s3fs>=2024.6" in runtime_requirements(PYPROJECT, extras=("s3",))
    with pytest.raises(KeyError, match="no extra 'gpu'"):
        runtime_requirements(PYPROJECT, extras=("gpu",))
    assert any(r.startswith("setuptools") for r in build_requirements(PYPROJECT)), "pip install -e . builds offline"


def test_the_download_is_binary_wheels_for_the_target_interpreter() -> None:
    cmd = download_command("w", ["numpy<3"], python_version="3.12", platforms=("manylinux_2_28_x86_64",))
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "--only-binary=:all:" in cmd
    assert (
        cmd[cmd.index("--python-version") + 1] == "3.12" and cmd[cmd.index("--platform") + 1] == "manylinux_2_28_x86_64"
    )
    assert cmd[-1] == "numpy<3" and cmd[cmd.index("--dest") + 1] == "w"


def test_requirement_names_are_normalised() -> None:
    assert requirement_name("Ruamel.Yaml>=0.18") == "ruamel-yaml" and requirement_name("dask[x]") == "dask"
    with pytest.raises(ValueError, match="not a requirement"):
        requirement_name(">=1")
