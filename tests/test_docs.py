"""The README, docs/*.md and infra/**/README.md: their links resolve, and every backticked Python name or repository path in
them still exists.

A backticked `pkg.module.name` whose first part is one of the project's packages must import (a module,
or an attribute of one, or an attribute of that: `storage.io.layout.Layout`, `trainer.spec.TrainSpec.identity`),
unless it is a config key (`trainer.nproc_per_node`: the `trainer` section shares the package's name).
A backticked `dir/file.py` whose first folder is one of the repository's must exist.  Text with
placeholders (`<model>`, `{date}`, `*`) is not a name, nor a path under a folder the code writes
(`OUTPUTS`).  Fenced code blocks are not checked.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "infra").rglob("README.md"))]
PACKAGES = ("flows", "pipeline", "trainer", "storage", "bench", "tests")
ROOT_DIRS = (*PACKAGES, "infra", "docs")
OUTPUTS = ("bench/results/",)
"""Folders the code writes (git-ignored): a path under them names an output, not a file of the repository."""

FENCE = re.compile(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DOTTED = re.compile(rf"^({'|'.join(PACKAGES)})(\.[A-Za-z_][A-Za-z0-9_]*)+$")
PATH = re.compile(rf"^({'|'.join(ROOT_DIRS)})/[A-Za-z0-9_./-]*$")


def _prose(text: str) -> str:
    """The text without its fenced code blocks (kept as blank lines, so line numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link keeps its text
    text = text.lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in re.finditer(r"(?m)^#{1,6}\s+(.+?)\s*#*\s*$", _prose(path.read_text())):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def broken_links(path: Path) -> list[str]:
    text = _prose(path.read_text())
    problems = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{_line(text, m.start())}"
        if not dest.exists():
            problems.append(f"{where}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return problems


@cache
def config_keys() -> frozenset[str]:
    """Every dotted config key and section of RunConfig (`trainer`, `trainer.nccl_env`, `checks.psi.action`)."""
    from flows.config import RunConfig

    keys: set[str] = set()

    def walk(obj, prefix):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            keys.add(prefix + f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")

    walk(RunConfig(), "")
    return frozenset(keys)


@cache
def resolves(name: str) -> bool:
    """`name` is an importable module, or attributes reached from the longest importable prefix."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def names(path: Path) -> list[tuple[int, str]]:
    """(line, token) of each backticked token that looks like a project name or repository path."""
    text = _prose(path.read_text())
    found = []
    for m in INLINE_CODE.finditer(text):
        for token in m.group(2).split():
            token = token.split("(", 1)[0].rstrip(":,;")
            if "<" in token or "{" in token or "*" in token:
                continue
            if DOTTED.match(token) or (PATH.match(token) and not token.startswith(OUTPUTS)):
                found.append((_line(text, m.start()), token))
    return found


def stale_names(path: Path) -> list[str]:
    problems = []
    for line, token in names(path):
        if "/" in token:
            ok = (REPO / token).exists()
        else:
            ok = token in config_keys() or resolves(token)
        if not ok:
            problems.append(f"{path.relative_to(REPO)}:{line}: `{token}` does not resolve")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    problems = broken_links(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_backticked_names_and_paths_resolve(path):
    problems = stale_names(path)
    assert not problems, "stale references:\n" + "\n".join(problems)


def test_the_readme_keeps_the_two_commands_and_says_what_is_not_run_here():
    text = (REPO / "README.md").read_text()
    assert "make demo   # creates .venv" in text and "make test   # creates .venv if needed" in text
    assert "## Not exercised here" in text
    for plain in ("GPUDirect RDMA", "multi-GPU", "nothing of this project has run on a GPU", "Multi-node"):
        assert plain in text, plain
    assert "(docs/user-guide.md)" in text and "(docs/config-reference.md)" in text
    assert len(text.encode()) <= 12 * 1024, "the README is for a first look: move details to docs/user-guide.md"


def test_the_checker_sees_what_it_should(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "# A `b` c\n\n[ok](#a-b-c) [bad](#nope) [gone](nowhere.md)\n\n"
        "`flows.config.RunConfig` `flows.config.Nope` `trainer.nproc_per_node` `flows/config.py` `flows/gone.py`\n"
        "`python -m bench.capacity --hours 2` `runs/<model>/date=D/` `optim.k_steps`\n\n"
        "```\n`flows.not_checked`\n```\n"
    )
    assert anchors(doc) == {"a-b-c"}
    assert [t for _, t in names(doc)] == [
        "flows.config.RunConfig", "flows.config.Nope", "trainer.nproc_per_node", "flows/config.py",
        "flows/gone.py", "bench.capacity",
    ]
    assert resolves("flows.config.RunConfig") and not resolves("flows.config.Nope")
    assert "trainer.nproc_per_node" in config_keys()
