"""One codec for every config dataclass: typed values from YAML/JSON data, and back.

`decode(cls, data)` builds a (nested) frozen config dataclass from plain data, checking every key
and value against the field's type annotation: an unknown key or a wrong type raises `ConfigError`
naming the dotted key, and a value the dataclass's own `__post_init__` refuses keeps its message.
`encode(obj)` is the inverse (`dataclasses.asdict`).  The run config (`flows.config`), the train
spec (`trainer.spec`) and model directories' `model.json` all go through it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

C = TypeVar("C")


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


def encode(obj: Any) -> dict[str, Any]:
    """Plain data (dicts, lists, scalars) of a config dataclass."""
    return dataclasses.asdict(obj)


def decode(cls: type[C], data: Any, *, prefix: str = "") -> C:
    """`cls` built from `data` (a mapping; missing keys take their defaults).

    Args:
        cls: a dataclass whose fields are annotated with bool, int, float, str, tuples, dicts,
            optionals or further dataclasses.
        data: the mapping (None counts as empty).
        prefix: the dotted key of `data` inside a larger config, for messages (e.g. "trainer.").

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or one the dataclass refuses.
    """
    return _build(cls, data, prefix)


def _build(cls: type, data: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known in {where}: {', '.join(sorted(fields))})")
    kwargs = {name: _coerce(hints[name], value, f"{prefix}{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc) if prefix == "" or prefix.rstrip(".") in str(exc) else f"{where}: {exc}") from exc


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, prefix=f"{key}.")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, key)
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
        return tuple(_coerce(args[0], v, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        if args:
            return {str(k): _coerce(args[1], v, f"{key}.{k}") for k, v in value.items()}
        return dict(value)
    return value
