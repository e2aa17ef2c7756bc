"""The releases RELEASES lists, and their code from this repository's history (the upgrade and release tests)."""

from __future__ import annotations

import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RELEASES = REPO / "RELEASES"
SEMVER = re.compile(r"0\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
"""A release's version: 0.MINOR.PATCH."""


@dataclass(frozen=True)
class Release:
    version: str
    commit: str | None
    """Its full hash; None for the release being cut (`-`: its commit is not made yet)."""

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.version.split("."))


def releases(text: str | None = None) -> list[Release]:
    """The lines of RELEASES (or `text`), oldest first.

    Raises:
        ValueError: a line that is not `VERSION COMMIT` or `VERSION -`, naming it.
    """
    out = []
    for n, line in enumerate((RELEASES.read_text() if text is None else text).splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not SEMVER.fullmatch(parts[0]) or not re.fullmatch(r"[0-9a-f]{40}|-", parts[1]):
            raise ValueError(f"RELEASES line {n}: {line!r} is not 'VERSION COMMIT' (0.x.y and a full hash, or -)")
        out.append(Release(parts[0], None if parts[1] == "-" else parts[1]))
    return out


def upgrade_sources() -> list[Release]:
    """The releases the upgrade test starts from: the first and the newest listed with a commit (once if one)."""
    cut = [r for r in releases() if r.commit]
    return list({r.commit: r for r in (cut[0], cut[-1])}.values()) if cut else []


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)


def need_history() -> None:
    """Skip, saying why, where the releases' commits cannot be in this checkout's history."""
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: a release's code comes from its history")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip(
            "a shallow clone: the releases' commits (RELEASES) are not in its history; "
            "`git fetch --unshallow` (or a full clone) runs this test"
        )


def release_tree(release: Release, dest: Path) -> Path:
    """`release`'s packages and test helpers at `dest`, from this repository's history (`git archive`)."""
    need_history()
    assert release.commit is not None
    have = git("cat-file", "-e", f"{release.commit}^{{commit}}")
    assert have.returncode == 0, (
        f"release {release.version}'s commit {release.commit} (RELEASES) is not in this clone's history"
    )
    archive = dest.with_suffix(".tar")
    with archive.open("wb") as out:
        paths = ["flows", "pipeline", "trainer", "storage", "tests/__init__.py", "tests/helpers"]
        subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", release.commit, *paths], stdout=out, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest
