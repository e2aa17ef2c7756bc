"""The README, docs/**/*.md and infra/**/README.md: their links resolve, every backticked Python name or repository
path in them still exists, and together they stay small enough to read.

What counts as a name or a path, and what resolves, is tests/helpers/references.py's rule (shared with
tests/test_code_references.py, which checks docstrings and comments).  Fenced code blocks are not checked.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers.references import (
    REPO,
    backticked,
    config_keys,
    exists,
    line_of,
    resolves,
)

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "infra").rglob("README.md"))]
BUDGET_BYTES = 150_000
"""README.md and docs/**/*.md together: a reference that grows past it has started keeping a log."""
BENCHMARKS_BYTES = 40_000
"""docs/benchmarks.md: what each benchmark measures, its command and its latest table (history lives in git)."""

FENCE = re.compile(r"(?ms)^ {0,3}(```|~~~).*?^ {0,3}\1")
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> str:
    """The text without its fenced code blocks (kept as blank lines, so line numbers hold)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


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
        where = f"{path.relative_to(REPO)}:{line_of(text, m.start())}"
        if not dest.exists():
            problems.append(f"{where}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: {target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return problems


def names(path: Path) -> list[tuple[int, str]]:
    """(line, token) of each backticked token that looks like a project name or repository path."""
    return backticked(_prose(path.read_text()))


def stale_names(path: Path) -> list[str]:
    rel = path.relative_to(REPO)
    return [f"{rel}:{line}: `{token}` does not resolve" for line, token in names(path) if not exists(token)]


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
        "flows.config.RunConfig",
        "flows.config.Nope",
        "trainer.nproc_per_node",
        "flows/config.py",
        "flows/gone.py",
        "bench.capacity",
    ]
    assert resolves("flows.config.RunConfig") and not resolves("flows.config.Nope")
    assert "trainer.nproc_per_node" in config_keys()


def test_the_docs_fit_their_budget():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    sizes = {p.relative_to(REPO): len(p.read_bytes()) for p in pages}
    total = sum(sizes.values())
    largest = ", ".join(f"{p} {n:,}" for p, n in sorted(sizes.items(), key=lambda x: -x[1])[:5])
    assert total <= BUDGET_BYTES, f"README + docs are {total:,} bytes > {BUDGET_BYTES:,} (largest: {largest})"
    bench = sizes[Path("docs/benchmarks.md")]
    assert bench <= BENCHMARKS_BYTES, f"docs/benchmarks.md is {bench:,} bytes > {BENCHMARKS_BYTES:,}"


def test_each_report_is_dated_and_says_its_decision_and_command():
    reports = sorted((REPO / "docs" / "reports").glob("*.md"))
    assert reports, "docs/reports/ holds one report per investigation whose decision is in force"
    for path in reports:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", path.name), path.name
        text = path.read_text()
        assert "**Decision.**" in text and "**Command" in text, (
            f"{path.name}: a decision and the command that measured it"
        )
