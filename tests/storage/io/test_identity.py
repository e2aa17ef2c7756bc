"""Field roles: what the identity hashes (and the neutral value it leaves out), what the shape rule compares,
and an unclassified field named (and refused) wherever the roles are read."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from storage.io.identity import (
    Role,
    declarations,
    identity_parts,
    result_field,
    role,
    run_field,
    shape_changes,
    shape_field,
    unclassified,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Section:
    width: int = shape_field(4)
    tokens: tuple[int, ...] = shape_field((2, 3))
    rate: float = result_field(0.1)
    gate: bool = shape_field(True, before=False)
    """Added later; a section saved before it had no gate."""
    timeout_s: int = run_field(60)
    env: dict[str, str] = run_field(factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Grown(Section):
    """`Section` after a release added a field that was off before."""

    boost: float = result_field(0.0, neutral=0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class Forgotten(Section):
    extra: int = 0


def test_an_unclassified_field_is_named_and_refused() -> None:
    assert unclassified(Section) == [] and unclassified(Forgotten) == ["extra"]
    with pytest.raises(TypeError, match=r"Forgotten fields \['extra'\] declare no role"):
        identity_parts(Forgotten())
    with pytest.raises(TypeError, match="declare no role"):
        shape_changes({}, Forgotten())
    assert set(declarations(Forgotten)) == set(declarations(Section))  # the undeclared one left out


def test_declarations_keep_defaults_and_roles() -> None:
    s = Section()
    assert (s.width, s.tokens, s.rate, s.timeout_s, s.env) == (4, (2, 3), 0.1, 60, {})
    assert Section().env is not s.env  # a factory, not a shared default
    roles = {name: d.role for name, d in declarations(Section).items()}
    assert roles == {
        "width": Role.SHAPE,
        "tokens": Role.SHAPE,
        "rate": Role.RESULT,
        "gate": Role.SHAPE,
        "timeout_s": Role.RUN,
        "env": Role.RUN,
    }
    with pytest.raises(ValueError, match="RUN field is never hashed"):
        role(Role.RUN, neutral=0)


def test_identity_parts_hash_what_changes_the_result_and_leave_neutral_values_out() -> None:
    parts = {"width": 4, "tokens": (2, 3), "rate": 0.1, "gate": True}
    assert identity_parts(Section(timeout_s=1, env={"A": "B"})) == parts  # RUN fields never
    assert identity_parts(Grown()) == parts  # a field added at its neutral value: the same parts, the same tags
    assert identity_parts(Grown(boost=0.5)) == parts | {"boost": 0.5}


def test_shape_changes_compare_shape_fields_only() -> None:
    saved = {"width": 4, "tokens": [2, 3], "rate": 0.1, "gate": True, "timeout_s": 60, "env": {}}  # as in JSON
    assert shape_changes(saved, Section(rate=0.5, timeout_s=1)) == []
    assert shape_changes(saved, Section(width=8, tokens=(2,)), prefix="s.") == ["s.tokens", "s.width"]
    assert shape_changes({**saved, "gone": 1}, Section()) == ["gone"]  # a key of another version
    assert shape_changes(saved, Section(width=8), unread=["width"]) == []  # ours does not read it


def test_a_field_the_saved_config_lacks_counts_unless_ours_holds_its_value_from_before() -> None:
    old = {"width": 4, "tokens": [2, 3], "rate": 0.1}
    assert shape_changes(old, Section()) == ["gate"]  # a gate the saved model does not have
    assert shape_changes(old, Section(gate=False)) == []  # as before the field existed
    assert shape_changes({k: v for k, v in old.items() if k != "width"}, Section(gate=False)) == ["width"]
    assert shape_changes(None, Section(gate=False)) == ["tokens", "width"]


def test_a_bare_field_is_unclassified() -> None:
    @dataclass
    class Plain:
        a: int = 0
        b: list[int] = field(default_factory=list)
        c: int = field(default=1, metadata=role(Role.RESULT))

    assert unclassified(Plain) == ["a", "b"]
