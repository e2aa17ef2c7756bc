"""The version of the code that produced an output, recorded in manifests and lineage."""

from __future__ import annotations

import subprocess
from pathlib import Path


def code_version() -> str:
    """The package version plus the git commit of the checkout when there is one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("ctr-pipeline")
    except PackageNotFoundError:
        ver = "0+unknown"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH; none found: no commit in the label
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{ver}+g{sha}" if sha else ver
