"""Releases: RELEASES lists each one's version and commit, CHANGELOG.md has a section with upgrade notes for each,
the package's version is the newest (or the next, while unreleased), and `ctrpipe --version` prints it."""

from __future__ import annotations

import re

import pytest

from flows.cli.main import main
from storage.io.version import VERSION, code_version
from tests.helpers.releases import REPO, Release, git, need_history, releases

CHANGELOG = (REPO / "CHANGELOG.md").read_text()
SECTION = re.compile(r"^## (0\.\d+\.\d+) — (.+)$", re.MULTILINE)
"""A version's section heading: `## 0.2.0 — unreleased`, `## 0.2.0 — 2026-12-07`, `## 0.1.0 — 2026-12-02 (bce5d75)`."""


def sections() -> dict[str, tuple[str, str]]:
    """Version -> (the heading's rest, the section's text up to the next version's heading)."""
    found = list(SECTION.finditer(CHANGELOG))
    ends = [m.start() for m in found[1:]] + [len(CHANGELOG)]
    return {m.group(1): (m.group(2), CHANGELOG[m.end() : end]) for m, end in zip(found, ends, strict=True)}


def test_the_releases_are_listed_oldest_first_with_one_pending_at_most_and_the_first_is_bce5d75():
    listed = releases()
    assert listed[0] == Release("0.1.0", "bce5d75ab3dc0f59f4cb4ef301a0abd148389030")
    assert [r.key for r in listed] == sorted({r.key for r in listed}), "versions ascending, each once"
    assert all(r.commit for r in listed[:-1]), "only the newest release may wait for its commit (-)"
    with pytest.raises(ValueError, match="line 1"):
        releases("0.2 abc")


def test_the_package_is_the_newest_release_or_the_next_one_and_changelog_has_a_section_for_each():
    listed, have = releases(), sections()
    newest = listed[-1]
    assert newest.version in have, f"CHANGELOG.md has no '## {newest.version} — ...' section (RELEASES' newest)"
    for r in listed:
        assert r.version in have and "### Upgrade notes" in have[r.version][1], f"{r.version}: no upgrade notes"
    assert list(have) == sorted(have, key=lambda v: tuple(map(int, v.split("."))), reverse=True), "newest first"
    key = tuple(map(int, VERSION.split(".")))
    assert key >= newest.key, f"VERSION {VERSION} is older than the newest release {newest.version}"
    if key > newest.key:  # work towards the next release
        assert have.get(VERSION, ("",))[0] == "unreleased", f"no '## {VERSION} — unreleased' section in CHANGELOG.md"
    assert next(iter(have)) == VERSION, "the top section is VERSION's"
    assert code_version().startswith(VERSION)


def test_ctrpipe_version_prints_the_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ctrpipe {VERSION}"


@pytest.mark.subprocess
def test_each_listed_commit_is_its_release():
    """The version in each listed commit's tree (storage/io/version.py, or pyproject.toml before it) is the one the
    line gives: a hash pasted on the wrong line fails here."""
    need_history()
    for r in releases():
        if r.commit is None:
            continue
        assert git("cat-file", "-e", f"{r.commit}^{{commit}}").returncode == 0, f"{r.version}: {r.commit} not here"
        texts = (git("show", f"{r.commit}:{path}").stdout for path in ("storage/io/version.py", "pyproject.toml"))
        found = next(filter(None, (re.search(r'^(?:VERSION|version) = "([^"]+)"', t, re.MULTILINE) for t in texts)))
        assert found.group(1) == r.version, f"{r.commit} is version {found.group(1)}, RELEASES says {r.version}"
