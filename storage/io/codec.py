"""One codec for every config dataclass: typed values from YAML/JSON data, and back.

`decode(cls, data)` builds a (nested) frozen config dataclass from plain data, checking every key
and value against the field's type annotation: an unknown key or a wrong type raises `ConfigError`
naming the dotted key, and a value the dataclass's own `__post_init__` refuses keeps its message.
`encode(obj)` is the inverse (`dataclasses.asdict`).  The run config (`flows.config`) and the train
spec (`trainer.launch.spec`) go through it strictly: a key a user misspells must fail.

Files the product writes (model.json, metrics.json, lineage, bundle manifests) outlive the code that
wrote them, so they are read with `unknown="ignore"` (through `storage.io.records`): a key this code
does not know (a retired or a newer field), at any depth, is skipped, a missing one takes its default,
and a wrong type still fails naming the key.  A hand-written codec rather than pydantic: the ranks
(`trainer.main`) import the config classes and stay light, and ~120 frozen config fields would
otherwise need rewriting as models.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar

C = TypeVar("C")
Unknown = Literal["error", "ignore"]


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


def encode(obj: Any) -> dict[str, Any]:
    """Plain data (dicts, lists, scalars) of a config dataclass."""
    return dataclasses.asdict(obj)


def decode(cls: type[C], data: Any, *, prefix: str = "", unknown: Unknown = "error") -> C:
    """`cls` built from `data` (a mapping; missing keys take their defaults).

    Args:
        cls: a dataclass whose fields are annotated with bool, int, float, str, tuples, dicts,
            optionals or further dataclasses.
        data: the mapping (None counts as empty).
        prefix: the dotted key of `data` inside a larger config, for messages (e.g. "trainer.").
        unknown: "error" (what a user writes: a misspelt key fails) or "ignore" (a persisted record:
            keys of other code versions are skipped, at every depth).

    Raises:
        ConfigError: an unknown key (unless ignored), a value of the wrong type, or one the dataclass refuses.
    """
    if unknown not in ("error", "ignore"):
        raise ValueError(f"unknown must be 'error' or 'ignore', got {unknown!r}")
    built: C = _build(cls, data, prefix, unknown)
    return built


def _build(cls: Any, data: Any, prefix: str, unknown: Unknown = "error") -> Any:
    where = prefix.rstrip(". :") or "config"  # "trainer." or a file's "<path>: " -> trainer, <path>
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = sorted(set(data) - set(fields))
    if extra and unknown == "error":
        raise ConfigError(f"unknown config key {prefix}{extra[0]} (known in {where}: {', '.join(sorted(fields))})")
    missing = [
        n
        for n, f in fields.items()
        if n not in data and f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{prefix}{missing[0]} is missing (a required key of {cls.__name__})")
    kwargs = {
        name: _coerce(hints[name], value, f"{prefix}{name}", unknown) for name, value in data.items() if name in fields
    }
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc) if prefix == "" or where in str(exc) else f"{where}: {exc}") from exc


def _coerce(tp: Any, value: Any, key: str, unknown: Unknown = "error") -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, f"{key}.", unknown)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key, unknown)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return str(value)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(args[0], v, f"{key}[{i}]", unknown) for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        if args:
            return {str(k): _coerce(args[1], v, f"{key}.{k}", unknown) for k, v in value.items()}
        return dict(value)
    return value
