"""One run's configuration: typed sections from YAML, overridable by `--set section.key=value`.

Every section is a frozen dataclass owned by the stage it configures; this module only
assembles them, through the one config codec (`storage.io.codec`).  Unknown keys and bad
values raise `ConfigError` naming the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flows.guards.check_config import ChecksConfig
from flows.guards.evaluation import EvaluateConfig
from flows.guards.gate import PublishConfig
from flows.prefect.alerts import AlertsConfig
from pipeline.config import (
    DaskConfig,
    EncodeConfig,
    IngestConfig,
    InputConfig,
    VocabConfig,
)
from pipeline.schema import LogSchema, get_schema, yaml_error_text
from storage.embedding.config import StoreConfig
from storage.io import codec
from storage.io.codec import ConfigError
from storage.io.layout import Layout, validate_model_name
from storage.io.registry import RegistryConfig
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.models.config import ModelConfig

__all__ = ["ConfigError", "RunConfig", "check_format", "from_dict", "load_config", "parse_yaml", "with_overrides"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    root: str = "./ctr-data"
    """Storage root URL (local folder or fsspec URL such as s3://bucket/prefix); everything a run commits lives under
    it.
    """
    storage_options: dict | None = None
    """fsspec options for the root (e.g. an S3 endpoint); credentials belong in the environment, not here."""
    model_name: str = "ctr"
    """Name of the model in the registry (`<root>/models/<model_name>/`)."""
    input: InputConfig = field(default_factory=InputConfig)
    """Where the day's raw logs are and their format (the ingest stage reads them)."""
    ingest: IngestConfig = field(default_factory=IngestConfig)
    """How ingest parses the raw logs into date-partitioned Parquet, and how many malformed rows a day may have."""
    dask: DaskConfig = field(default_factory=DaskConfig)
    """The Dask cluster of the data stages (ingest, vocab, encode): an existing scheduler, or a LocalCluster's size."""
    vocab: VocabConfig = field(default_factory=VocabConfig)
    """Which categorical values get their own key: counts over a window of days, admission, eviction."""
    encode: EncodeConfig = field(default_factory=EncodeConfig)
    """How the encode stage splits the day into train and eval rows."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """The tiered embedding store: row width, initialisation, host budget, device cache, SSD tier."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The network: architecture and its sizes; every key changes the trained model."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """The optimisation itself (batch, passes, learning rates, regularisation, k-step merge); every key
    changes the trained model."""
    het: HetConfig = field(default_factory=HetConfig)
    """HET's worker-side cache of remote embedding rows with a staleness bound; every key changes the trained model."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """How the training job runs (processes, nodes, backend, device, timeouts, checkpoints); none of it
    changes the trained model except the world's shape and `trainer.precision`."""
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    """The data checks between encode and training: thresholds, and one action per check (`checks.<name>.action`)."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """How the evaluate stage samples and scores."""
    publish: PublishConfig = field(default_factory=PublishConfig)
    """The publish gate: what it refuses, and how long a run waits for the model's slot."""
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    """Where `ctrpipe deploy`'s alert automations send, and when a missing daily run alerts."""
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    """Retention of the model registry: how many versions are kept."""

    def __post_init__(self) -> None:
        if not self.root:
            raise ConfigError("root must not be empty")
        try:
            validate_model_name(self.model_name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.model.companion == "poly2" and not self.encode.raw_keys:
            raise ConfigError(
                "model.companion=poly2 reads each value's own key on every day: set encode.raw_keys=true "
                "too (the features then carry r_<j> beside k_<j>), or model.companion=auto (a "
                "companion on the days encoded with them)"
            )
        if self.store.embedding_dim % self.model.num_heads:
            raise ConfigError(
                f"model.num_heads ({self.model.num_heads}) must divide store.embedding_dim ({self.store.embedding_dim})"
            )

    def layout(self) -> Layout:
        """Where this run's outputs live (`storage.io.layout`).

        The vocabulary and the features are filed under digests of the config they depend on, so two
        models on one root share them exactly when those configs are equal.
        """
        vocab_key = _digest({"format": self.input.format, "vocab": codec.encode(self.vocab)})
        encode = codec.encode(self.encode)
        if not self.encode.raw_keys:  # the features of before the key: their folder keeps its name
            encode.pop("raw_keys")
        # which days carry the own keys is each day's manifest `source` (a change re-encodes those days)
        encode.pop("raw_keys_up_to")
        features_key = _digest({"vocab": vocab_key, "encode": encode})
        return Layout(
            self.root,
            self.model_name,
            self.storage_options,
            self.store.local_dir,
            vocab_key=vocab_key,
            features_key=features_key,
        )

    def to_dict(self) -> dict[str, Any]:
        return codec.encode(self)


class _ConfigLoader(yaml.SafeLoader):
    """YAML with YAML 1.2's booleans, true and false only: `off`, `on`, `yes` and `no` stay words, so
    `model.companion: off` or `checks.volume.action: off` read as written (PyYAML's YAML 1.1 made them false)."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_yaml(text: str) -> Any:
    """A config file's or a `--set` value's YAML (`_ConfigLoader`).

    Raises:
        yaml.YAMLError: not YAML.
    """
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader)


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:10]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    base: RunConfig | None = None,
) -> RunConfig:
    """`base` (default: built-in defaults), then a YAML file, then `section.key=value` overrides (parsed as YAML).

    Everything is checked here, before anything starts: every key and value, and the schema file
    behind `input.format` (`check_format`).
    """
    data: dict[str, Any] = base.to_dict() if base is not None else {}
    if path:
        try:
            loaded = parse_yaml(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: {yaml_error_text(exc)}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}")
        _merge(data, loaded)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        _set_path(data, key.strip().split("."), parse_yaml(raw) if raw != "" else "")
    cfg = from_dict(data)
    check_format(cfg.input.format, key="input.format")
    return cfg


def check_format(fmt: str, *, key: str) -> LogSchema:
    """The schema `fmt` names, read now (a schema file's typo fails here, before any cluster starts).

    Raises:
        ConfigError: naming `key`, when the schema file is missing, not YAML or not a valid schema.
    """
    try:
        return get_schema(fmt)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{key}: {exc}") from None


def from_dict(data: dict[str, Any]) -> RunConfig:
    return codec.decode(RunConfig, data)


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
