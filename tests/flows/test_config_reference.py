"""docs/config-reference.md: generated from the config dataclasses' field docstrings, complete, current."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from flows import config_reference
from flows.config import RunConfig, from_dict

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "config-reference.md"


def test_every_config_key_has_a_field_docstring():
    missing = config_reference.undocumented()
    assert not missing, (
        f"config keys without a docstring (add a string literal right after the field in its dataclass): "
        f"{', '.join(missing)}"
    )


def test_the_reference_is_what_the_generator_writes():
    assert REFERENCE.read_text() == config_reference.render(), (
        f"docs/config-reference.md is stale: regenerate it with `{config_reference.COMMAND}`"
    )


def test_the_reference_lists_every_key_with_its_default():
    """Its YAML block is what a user copies: it must parse and equal the defaults; and every leaf key has a
    row whose default is the key's value in `RunConfig()`."""
    text = REFERENCE.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert from_dict(yaml.safe_load(block)) == RunConfig()

    def leaves(obj, prefix=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                yield from leaves(value, f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}", list(value) if isinstance(value, tuple) else value

    rows = {m.group(1): m.group(2) for m in re.finditer(r"(?m)^\| `([^`]+)` \| `[^`]*` \| `([^`]*)` \|", text)}
    defaults = dict(leaves(RunConfig()))
    assert len(defaults) > 100
    assert sorted(rows) == sorted(defaults), "the reference's rows are not RunConfig's keys"
    wrong = {k: (rows[k], v) for k, v in defaults.items() if yaml.safe_load(rows[k]) != v}
    assert not wrong, f"rows whose default is not the key's value in RunConfig() (row, value): {wrong}"


def test_field_docs_are_read_from_the_class_body():
    @dataclasses.dataclass
    class Example:
        a: int = 1
        """The a."""
        b: int = dataclasses.field(default=2, metadata={"x": 1})
        """The b,
        on two lines."""
        c: int = 3

    assert config_reference.field_docs(Example) == {"a": "The a.", "b": "The b,\non two lines."}
