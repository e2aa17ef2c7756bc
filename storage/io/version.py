"""The version of the code that produced an output, recorded in manifests and lineage, and `ctrpipe --version`."""

from __future__ import annotations

import subprocess
from pathlib import Path

VERSION = "0.2.0"
"""The release this code is (0.MINOR.PATCH, semantic: a MINOR changes what users must read in the upgrade notes).
pyproject.toml reads it (`[tool.setuptools.dynamic]`); RELEASES lists each release's commit (how a release is cut:
that file's header)."""

CHECKOUT = Path(__file__).resolve().parents[2]
"""The tree the packages sit in: a git checkout when they run from one (an editable install), not from a wheel."""


def code_version() -> str:
    """`VERSION`, plus the git commit when the packages run from a git checkout (`0.2.0+g3fad3b4`)."""
    if not (CHECKOUT / ".git").exists() or not (CHECKOUT / "pyproject.toml").exists():
        return VERSION  # an installed wheel: the site-packages around it may sit in anyone's checkout
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH; none found: no commit in the label
            cwd=CHECKOUT,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"{VERSION}+g{sha}" if sha else VERSION
