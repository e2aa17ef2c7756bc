"""The configuration reference (docs/config-reference.md), generated from the config dataclasses.

Every key of `flows.config.RunConfig` is documented once, where it is declared: the string literal
right after the field in its dataclass's body.  This module walks RunConfig's sections and their
fields and writes, per section, each dotted key with its type, its default and that docstring, after
a YAML block of every key with its default::

    python -m flows.config_reference > docs/config-reference.md

`tests/flows/test_config_reference.py` fails when the file differs from what this writes, or when a
field has no docstring (`undocumented`).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_type_hints

import yaml

from flows.config import RunConfig

COMMAND = "python -m flows.config_reference > docs/config-reference.md"
"""The command that regenerates docs/config-reference.md."""


@dataclass(frozen=True)
class Key:
    """One leaf key of the run config."""

    key: str
    """The dotted key, as `--set` takes it (`optim.k_steps`)."""
    type: str
    """The field's annotation, as written in its class."""
    default: Any
    """The key's value in `RunConfig()`, as plain data (lists for tuples)."""
    doc: str
    """The field's docstring (for a field of a nested dataclass, the outer field's one, then its own)."""


@dataclass(frozen=True)
class Section:
    """A top-level dataclass field of RunConfig (`optim`), or the top-level scalars (name "")."""

    name: str
    doc: str
    declared_in: str
    """`module.Class` of the section's dataclass."""
    keys: tuple[Key, ...]


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring right after the field in `cls`'s body (fields without one are absent)."""
    source = textwrap.dedent(inspect.getsource(cls))
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef), cls  # noqa: S101 - the config's own source
    docs: dict[str, str] = {}
    body = node.body
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _leaves(obj: Any, prefix: str, outer_doc: str) -> Iterator[Key]:
    """The leaf keys under the config dataclass instance `obj`, each with its value in `obj` as its default
    (the default of a nested dataclass's field is the outer field's: `checks.psi.action` is `warn`)."""
    cls: type = type(obj)
    docs = field_docs(cls)
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        own = docs.get(f.name, "")
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            for leaf in _leaves(value, f"{prefix}{f.name}.", own):
                yield leaf if own else dataclasses.replace(leaf, doc="")  # an undocumented outer field
        else:
            yield Key(f"{prefix}{f.name}", str(f.type), _plain(value), f"{outer_doc} {own}".strip() if own else "")


def sections() -> list[Section]:
    """RunConfig's top-level scalars, then each section, in declaration order, with the defaults of `RunConfig()`."""
    default = RunConfig()
    docs = field_docs(RunConfig)
    hints = get_type_hints(RunConfig)
    top: list[Key] = []
    out: list[Section] = []
    for f in dataclasses.fields(RunConfig):
        tp: type = hints[f.name]
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(tp):
            out.append(
                Section(
                    f.name,
                    docs.get(f.name, ""),
                    f"{tp.__module__}.{tp.__qualname__}",
                    tuple(_leaves(value, f"{f.name}.", "")),
                )
            )
        else:
            top.append(Key(f.name, str(f.type), _plain(value), docs.get(f.name, "")))
    return [Section("", "Keys outside any section.", "flows.config.RunConfig", tuple(top)), *out]


def undocumented() -> list[str]:
    """Dotted keys (and sections) that have no field docstring."""
    missing: list[str] = []
    for section in sections():
        if section.name and not section.doc:
            missing.append(section.name)
        missing += [k.key for k in section.keys if not k.doc]
    return missing


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").strip()


def defaults_yaml() -> str:
    """Every key with its default, as a YAML file: one line a key, a section's keys indented under it."""
    lines: list[str] = []
    names = {s.name for s in sections()}
    for key, value in _plain(RunConfig().to_dict()).items():
        if isinstance(value, dict) and key in names:
            lines.append(f"{key}:")
            lines += [f"  {k}: {_yaml_value(v)}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {_yaml_value(value)}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return _one_line(text).replace("|", "\\|")


def render() -> str:
    """The text of docs/config-reference.md."""
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the config dataclasses' field docstrings: `{COMMAND}`.",
        "     Do not edit by hand: tests/flows/test_config_reference.py fails when this file is stale. -->",
        "",
        "A run's configuration is one YAML file of sections, all optional, applied on top of a preset",
        "(`flows/presets.py`: `default`, `demo`), then `--set section.key=value` overrides (values parsed as YAML:",
        "`--set model.mlp_dims=[64,32]`).  Unknown keys and bad values are errors that name the key, raised when the",
        "config is loaded (`flows.config.load_config`), before Prefect or Dask start.  A production file sets little",
        "more than `root`, `input.url`, `dask.address` and `trainer.*`: `infra/prod.example.yaml` is a commented one",
        "to copy.",
        "",
        "Every `optim.*`, `het.*` and `model.*` key changes the trained model; `trainer.*` keys (how the job runs) do",
        "not, except the world's shape and `trainer.precision`.  Keys whose default is `auto` are derived from the",
        "day's train rows when its training starts (`trainer.plan.recipe.derive`); a number in the config always wins.",
        "",
        "Each key is documented where it is declared (the class named under each section); this page is generated",
        f"from those docstrings by `{COMMAND}`.",
        "",
        "## Every key with its default",
        "",
        "```yaml",
        defaults_yaml().rstrip("\n"),
        "```",
        "",
    ]
    for section in sections():
        title = f"`{section.name}`" if section.name else "Top level"
        lines += [f"## {title}", "", f"{_one_line(section.doc)}  Declared in `{section.declared_in}`.", ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for k in section.keys:
            lines.append(f"| `{k.key}` | `{_cell(k.type)}` | `{_cell(_yaml_value(k.default))}` | {_cell(k.doc)} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    missing = undocumented()
    if missing:
        print(f"config keys without a field docstring: {', '.join(missing)}", file=sys.stderr)
    sys.stdout.write(render())
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
