"""Every backticked `pkg.module.name` or repository path in the code's docstrings and `#` comments still resolves.

The same rule as the docs (tests/helpers/references.py): a backticked dotted name starting with one of the
project's packages imports (or is a config key), a backticked `dir/file.py` exists.  Only docstrings (a string
that is a statement of its own: a module's, class's, function's or attribute's) and comments are read, through
`tokenize`: string values in the code are data, not references.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

from tests.helpers.references import REPO, backticked, exists

SCANNED = ("flows", "pipeline", "trainer", "storage", "bench", "tests/helpers")
SOURCES = sorted(p for d in SCANNED for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts)

_BEFORE_STATEMENT = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
_SKIPPED = {tokenize.NL, tokenize.COMMENT}


def references(source: str) -> list[tuple[int, str]]:
    """(line, token) of each backticked project name or path in the docstrings and comments of `source`."""
    found = []
    prev = tokenize.NEWLINE  # the last significant token's type: a statement starts after NEWLINE/INDENT/DEDENT
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            found += [(tok.start[0] + line - 1, name) for line, name in backticked(tok.string)]
            continue
        if tok.type == tokenize.NL:
            continue
        if tok.type == tokenize.STRING and prev in _BEFORE_STATEMENT:
            after = next((t for t in tokens[i + 1 :] if t.type not in _SKIPPED), None)
            if after is None or after.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                found += [(tok.start[0] + line - 1, name) for line, name in backticked(tok.string)]
        prev = tok.type
    return found


def stale_references(paths: list[Path]) -> tuple[int, list[str]]:
    """How many references `paths` hold, and a "file:line: `name` does not resolve" line for each stale one."""
    scanned = 0
    problems = []
    for path in paths:
        for line, name in references(path.read_text()):
            scanned += 1
            if not exists(name):
                where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
                problems.append(f"{where}:{line}: `{name}` does not resolve")
    return scanned, problems


def test_backticked_names_and_paths_in_docstrings_and_comments_resolve():
    scanned, problems = stale_references(SOURCES)
    assert scanned > 0
    assert not problems, f"{len(problems)} stale references of {scanned}:\n" + "\n".join(problems)


def test_the_scanner_reads_docstrings_and_comments_only(tmp_path):
    source = (
        '"""Module: `flows.config.RunConfig`\n\nand `flows/gone.py`."""\n'
        "X = 1\n"
        '"""An attribute\'s docstring: `trainer.nproc_per_node`."""\n'
        'Y = "`flows.not_a_docstring`"\n'
        'f("`flows.an_argument`")\n'
        "def g():\n"
        '    """`storage.io.layout.Nope` <- stale"""\n'
        "    return 1  # see `pipeline.ingest` and `runs/<model>/` and `bench/results/x.json`\n"
    )
    assert references(source) == [
        (1, "flows.config.RunConfig"),
        (3, "flows/gone.py"),
        (5, "trainer.nproc_per_node"),
        (9, "storage.io.layout.Nope"),
        (10, "pipeline.ingest"),
    ]
    assert [exists(name) for _, name in references(source)] == [True, False, True, False, True]
    path = tmp_path / "x.py"
    path.write_text(source + "# a hook `tests.helpers.faults:crash_at_step`, `tests.helpers.faults:nope`\n")
    assert stale_references([path]) == (
        7,
        [
            f"{path}:3: `flows/gone.py` does not resolve",
            f"{path}:9: `storage.io.layout.Nope` does not resolve",
            f"{path}:11: `tests.helpers.faults:nope` does not resolve",
        ],
    )
