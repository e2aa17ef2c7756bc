"""Backticked references to the project's code, and whether they still resolve: shared by tests/test_docs.py
(README.md, docs/*.md, infra READMEs) and tests/test_code_references.py (docstrings and comments).

A backticked `pkg.module.name` (or `pkg.module:name`) whose first part is one of the project's packages must import
(a module, or an attribute of one, or an attribute of that: `storage.io.layout.Layout`,
`trainer.launch.spec.TrainSpec.identity`),
unless it is a config key (`trainer.nproc_per_node`: the `trainer` section shares the package's name).
A backticked `dir/file.py` whose first folder is one of the repository's must exist.  Text with
placeholders (`<model>`, `{date}`, `*`) is not a name, nor a path under a folder the code writes
(`OUTPUTS`).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "pipeline", "trainer", "storage", "bench", "tests")
ROOT_DIRS = (*PACKAGES, "infra", "docs")
OUTPUTS = ("bench/results/",)
"""Folders the code writes (git-ignored): a path under them names an output, not a file of the repository."""

INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
DOTTED = re.compile(rf"^({'|'.join(PACKAGES)})(\.[A-Za-z_][A-Za-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_]*)?$")
"""`pkg.module.name`, or `pkg.module:name` as a hook spec names it (`tests.helpers.faults:crash_at_step`)."""
PATH = re.compile(rf"^({'|'.join(ROOT_DIRS)})/[A-Za-z0-9_./-]*$")


def line_of(text: str, pos: int) -> int:
    """The 1-based line of offset `pos` in `text`."""
    return text.count("\n", 0, pos) + 1


def backticked(text: str) -> list[tuple[int, str]]:
    """(line within `text`, token) of each backticked token that looks like a project name or repository path."""
    found = []
    for m in INLINE_CODE.finditer(text):
        for token in m.group(2).split():
            token = token.split("(", 1)[0].rstrip(":,;")
            if "<" in token or "{" in token or "*" in token:
                continue
            if DOTTED.match(token) or (PATH.match(token) and not token.startswith(OUTPUTS)):
                found.append((line_of(text, m.start()), token))
    return found


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


def _is_field(cls: object, name: str) -> bool:
    """`name` is a field a class declares without a value (a dataclass's or NamedTuple's: `Rows.clock`)."""
    return isinstance(cls, type) and any(name in vars(c).get("__annotations__", {}) for c in cls.__mro__)


@cache
def resolves(name: str) -> bool:
    """`name` is an importable module, or attributes reached from the longest importable prefix (the last
    of which may be a class's declared field)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for j, attr in enumerate(parts[i:], start=i):
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            else:
                return j == len(parts) - 1 and _is_field(obj, attr)
        return True
    return False


def exists(token: str) -> bool:
    """A backticked path names a file or folder of the repository; a dotted name resolves or is a config key."""
    if "/" in token:
        return (REPO / token).exists()
    return token in config_keys() or resolves(token.replace(":", "."))
