"""What identifies a trained run: each config field declares once what a change of it does.

A field is declared with `shape_field`, `result_field` or `run_field` (dataclass field metadata)
instead of a bare default, and three rules read the declarations instead of keeping lists by hand:

- the run identity (`trainer.launch.spec.TrainSpec.identity`) hashes `identity_parts` of every section;
- the dense warm start (`trainer.models.config.reshaping_changes`) compares `shape_changes`;
- `unclassified` names the fields that declare nothing (tests fail on them; `identity_parts` refuses them).

The identity names a run's checkpoints and its committed candidate, so it must not move when the code
does: a field added later declares a `neutral` value, the one that reproduces the behaviour from before
it existed, and the identity leaves it out while it holds that value (today's tags stay as they are).
It lives here, below everything, because `storage.embedding.config.StoreConfig` declares its fields too.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from typing import Any

KEY = "ctrpipe.role"
"""The dataclass field metadata key holding a field's `Declared`."""


class Role(enum.Enum):
    """What changing a config field does to a trained run."""

    SHAPE = "shape"
    """Changes the dense parameters' shapes or what they mean: a model saved with another value is no
    dense warm start.  It changes the trained result as well (hashed by the identity)."""
    RESULT = "result"
    """Changes the trained result (hashed by the identity) and leaves the dense parameters as they are."""
    RUN = "run"
    """How the job runs (paths, timeouts, log and checkpoint intervals, caches): never hashed, so a rerun
    with another value resumes the same run's checkpoints and reuses its committed candidate."""


class _Unset:
    """No value declared (None can be a field's neutral value)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclasses.dataclass(frozen=True)
class Declared:
    """One field's declaration (its metadata under `KEY`)."""

    role: Role
    neutral: Any = UNSET
    """The value that reproduces the behaviour from before the field existed, for a field added after
    run tags were in use: the identity leaves the field out while it holds this value, so the runs
    that do not use it keep their tags.  Never give one to a field the identity already hashes (its
    hash would change for that value)."""
    before: Any = UNSET
    """The value a config saved before the field existed had in effect (`shape_changes` compares a saved
    config lacking the field as if it held this); defaults to `neutral`."""
    why: str = ""
    """Why the role, when it is not obvious from the field's docstring."""

    @property
    def absent_value(self) -> Any:
        """What a saved config lacking the field stands for (`before`, else `neutral`), or UNSET."""
        return self.neutral if self.before is UNSET else self.before


def role(kind: Role, *, neutral: Any = UNSET, before: Any = UNSET, why: str = "") -> dict[str, Declared]:
    """Field metadata declaring `kind`: `dataclasses.field(default=..., metadata=role(Role.RESULT))`.

    Raises:
        ValueError: a neutral value on a RUN field (never hashed: nothing to keep neutral).
    """
    if kind is Role.RUN and neutral is not UNSET:
        raise ValueError("a RUN field is never hashed: it has no neutral value")
    return {KEY: Declared(kind, neutral, before, why)}


def _field(kind: Role, default: Any, factory: Any, neutral: Any, before: Any, why: str) -> Any:
    return dataclasses.field(
        default=default, default_factory=factory, metadata=role(kind, neutral=neutral, before=before, why=why)
    )


def shape_field(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    neutral: Any = UNSET,
    before: Any = UNSET,
    why: str = "",
) -> Any:
    """A dataclass field declared `Role.SHAPE` (its default, or its `factory`)."""
    return _field(Role.SHAPE, default, factory, neutral, before, why)


def result_field(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    neutral: Any = UNSET,
    before: Any = UNSET,
    why: str = "",
) -> Any:
    """A dataclass field declared `Role.RESULT` (its default, or its `factory`)."""
    return _field(Role.RESULT, default, factory, neutral, before, why)


def run_field(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, why: str = "") -> Any:
    """A dataclass field declared `Role.RUN` (its default, or its `factory`)."""
    return _field(Role.RUN, default, factory, UNSET, UNSET, why)


def declarations(cls: type) -> dict[str, Declared]:
    """The declared fields of the config dataclass `cls`, by name (unclassified ones left out)."""
    return {f.name: f.metadata[KEY] for f in dataclasses.fields(cls) if KEY in f.metadata}


def unclassified(cls: type) -> list[str]:
    """The fields of the config dataclass `cls` that declare no role."""
    return [f.name for f in dataclasses.fields(cls) if KEY not in f.metadata]


def _declared(cls: type) -> dict[str, Declared]:
    """`declarations(cls)`; every field must have one.

    Raises:
        TypeError: a field declares no role (an identity without it could miss what changes a run).
    """
    if missing := unclassified(cls):
        raise TypeError(
            f"{cls.__name__} fields {missing} declare no role (storage.io.identity: "
            "shape_field, result_field or run_field)"
        )
    return declarations(cls)


def identity_parts(obj: Any) -> dict[str, Any]:
    """The fields of the config `obj` that change the trained result, as plain data (`dataclasses.asdict`
    values): SHAPE and RESULT fields, less those holding their neutral value.

    Raises:
        TypeError: a field of `obj` declares no role.
    """
    declared = _declared(type(obj))
    plain = dataclasses.asdict(obj)
    return {
        name: plain[name]
        for name, d in declared.items()
        if d.role is not Role.RUN and (d.neutral is UNSET or getattr(obj, name) != d.neutral)
    }


def _json(value: Any) -> Any:
    """A value as its JSON round trip has it (tuples are lists), for comparing with saved data."""
    if isinstance(value, tuple | list):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


def with_absent_values(saved: Mapping[str, Any] | None, cls: type) -> dict[str, Any]:
    """`saved` (plain data of a config of `cls`, written by some release) with every declared field it lacks
    at the value it stood for before the field existed (`Declared.absent_value`), where one is declared:
    what that release ran with.  Fields without one stay absent (a decoder gives them today's default)."""
    filled = dict(saved or {})
    for name, declared in _declared(cls).items():
        if name not in filled and declared.absent_value is not UNSET:
            filled[name] = declared.absent_value
    return filled


def shape_changes(
    saved: Mapping[str, Any] | None, ours: Any, *, prefix: str = "", unread: Iterable[str] = ()
) -> list[str]:
    """The keys (`prefix` + name) of the SHAPE fields whose saved value (plain data, e.g. a model.json
    `model_config`) differs from `ours`: a non-empty list means the saved parameters do not fit `ours`.

    `unread` names fields `ours` does not read (e.g. another architecture's): they are not compared.
    A field the saved config lacks counts as changed unless it declares the value it stood for before it
    existed (`Declared.before` / `neutral`) and ours holds it; a saved key `ours` does not know (a config
    of another version) counts as changed.

    Raises:
        TypeError: a field of `ours` declares no role.
    """
    declared = _declared(type(ours))
    skip = set(unread)
    shaping = {n for n, d in declared.items() if d.role is Role.SHAPE and n not in skip}
    mine = {n: _json(getattr(ours, n)) for n in shaping}
    filled = with_absent_values(saved, type(ours))
    theirs = {k: _json(v) for k, v in filled.items() if k in shaping or k not in declared}
    return [prefix + name for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]
