"""One run's configuration: typed sections from YAML, overridable by `--set section.key=value`.

Every section is a frozen dataclass owned by the stage it configures; this
module only assembles them.  Unknown keys and bad values raise `ConfigError`
naming the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.config import (
    DaskConfig,
    EncodeConfig,
    IngestConfig,
    InputConfig,
    VocabConfig,
)
from storage.config import StoreConfig
from trainer.config import ModelConfig, PublishConfig, TrainerConfig

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ConfigError(ValueError):
    """A configuration key is unknown or its value is invalid; the message names the key."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    root: str = "./ctr-data"
    """Storage root URL (local folder or fsspec URL such as s3://bucket/prefix); everything a run commits lives under it."""
    storage_options: dict | None = None
    """fsspec options for the root (e.g. an S3 endpoint); credentials belong in the environment, not here."""
    model_name: str = "ctr"
    """Name of the model in the registry (`<root>/models/<model_name>/`)."""
    input: InputConfig = field(default_factory=InputConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    dask: DaskConfig = field(default_factory=DaskConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)

    def __post_init__(self) -> None:
        if not self.root:
            raise ConfigError("root must not be empty")
        if not _NAME.match(self.model_name):
            raise ConfigError(f"model_name must match {_NAME.pattern} (it becomes a path), got {self.model_name!r}")
        if self.store.embedding_dim % self.model.num_heads:
            raise ConfigError(
                f"model.num_heads ({self.model.num_heads}) must divide store.embedding_dim ({self.store.embedding_dim})"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    base: RunConfig | None = None,
) -> RunConfig:
    """`base` (default: built-in defaults), then a YAML file, then `section.key=value` overrides (parsed as YAML)."""
    data: dict[str, Any] = base.to_dict() if base is not None else {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        _merge(data, loaded)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        _set_path(data, key.strip().split("."), yaml.safe_load(raw) if raw != "" else "")
    return from_dict(data)


def from_dict(data: dict[str, Any]) -> RunConfig:
    return _build(RunConfig, data, prefix="")


def with_overrides(config: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """A copy of `config` with dotted-key overrides applied and validated again."""
    data = config.to_dict()
    for key, value in overrides.items():
        _set_path(data, key.split("."), value)
    return from_dict(data)


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _set_path(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"{'.'.join(parts)}: {part} is not a section")
        node = nxt
    node[parts[-1]] = value


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
