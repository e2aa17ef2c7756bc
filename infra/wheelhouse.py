"""Download every runtime dependency of the project except torch as wheels, for an offline install.

    make wheelhouse DIR=wheels PYVER=3.12 PLATFORM=manylinux_2_28_x86_64
    python infra/wheelhouse.py --dest wheels --python-version 3.12 --platform manylinux_2_28_x86_64

An air-gapped CUDA host keeps its own torch build (its CUDA, its NCCL); everything else the project
needs comes from the folder this writes, plus the build backend (setuptools, wheel) that
`pip install -e .` needs without a network:

    python -m venv --system-site-packages .venv          # sees the host's torch
    .venv/bin/pip install --no-index --find-links wheels -e .

torch is left out on purpose: a wheel of it from PyPI would be another CUDA build (gigabytes) that
pip would install over the host's.  The requirements are read from pyproject.toml, so this list
never goes stale.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEFT_OUT = frozenset({"torch"})
"""Distributions the host brings itself."""
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirement_name(req: str) -> str:
    """The normalised distribution name of a requirement string (`dask[dataframe]>=1` -> `dask`)."""
    m = _NAME.match(req)
    if not m:
        raise ValueError(f"not a requirement: {req!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def runtime_requirements(pyproject: str, *, extras: tuple[str, ...] = ()) -> list[str]:
    """The project's runtime requirements (and those of `extras`), less the ones the host brings (torch).

    Raises:
        KeyError: an extra pyproject.toml does not declare.
    """
    project = tomllib.loads(pyproject)["project"]
    reqs = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise KeyError(f"no extra {extra!r} in pyproject.toml (have {sorted(optional)})")
        reqs += optional[extra]
    return [r for r in reqs if requirement_name(r) not in LEFT_OUT]


def build_requirements(pyproject: str) -> list[str]:
    """What `pip install -e .` needs to build the project offline (`[build-system] requires`)."""
    return list(tomllib.loads(pyproject)["build-system"]["requires"])


def download_command(
    dest: str, requirements: list[str], *, python_version: str, platforms: tuple[str, ...], python: str = sys.executable
) -> list[str]:
    """`pip download` of `requirements` (and what they need) as binary wheels for another interpreter."""
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "--only-binary=:all:",
        "--dest",
        dest,
        "--python-version",
        python_version,
        "--implementation",
        "cp",
    ]
    for p in platforms:
        cmd += ["--platform", p]
    return cmd + requirements


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", required=True, help="folder to put the wheels in")
    ap.add_argument(
        "--python-version",
        default=f"{sys.version_info.major}.{sys.version_info.minor}",
        help="the target interpreter's X.Y (default: this one's)",
    )
    ap.add_argument(
        "--platform",
        action="append",
        default=None,
        help="wheel platform tags to accept (repeatable; default the manylinux x86_64 ones)",
    )
    ap.add_argument("--extra", action="append", default=[], help="also an optional extra (e.g. s3)")
    args = ap.parse_args(argv)
    text = (REPO / "pyproject.toml").read_text()
    platforms = tuple(args.platform or ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"))
    reqs = runtime_requirements(text, extras=tuple(args.extra)) + build_requirements(text)
    Path(args.dest).mkdir(parents=True, exist_ok=True)
    cmd = download_command(args.dest, reqs, python_version=args.python_version, platforms=platforms)
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd)  # noqa: S603 - pip of this interpreter, arguments from pyproject.toml, no shell


if __name__ == "__main__":
    sys.exit(main())
