"""One run's configuration: typed sections from YAML, overridable by `--set section.key=value`.

Every section is a frozen dataclass owned by the stage it configures; this module only
assembles them, through the one config codec (`storage.io.codec`).  Unknown keys and bad
values raise `ConfigError` naming the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from storage.io.identity import Role, declarations, with_absent_values
from storage.io.layout import Layout, validate_model_name
from storage.io.registry import RegistryConfig
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.models.config import ModelConfig

if TYPE_CHECKING:  # model.json's record; only its type is needed here (trainer.model_dir imports torch)
    from trainer.model_dir import ModelMeta

log = logging.getLogger("ctrpipe")

__all__ = [
    "ConfigError",
    "RunConfig",
    "check_format",
    "config_sources",
    "from_dict",
    "lineage_config",
    "lineage_values",
    "load_config",
    "parse_yaml",
    "shape_keys",
    "with_overrides",
]


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
    set_keys: tuple[str, ...] = ()
    """The dotted keys the config file and `--set` gave (`load_config` fills it in; a preset's values are defaults).
    A lineage keeps its published model's value of every shape key not named here (`lineage_config`): a default
    that changes between releases reaches new lineages only."""

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
    given: list[str] = list(data.get("set_keys", ()))
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
        given += _leaves(loaded)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        value = parse_yaml(raw) if raw != "" else ""
        _set_path(data, key.strip().split("."), value)
        given += _leaves({key.strip(): value})
    data["set_keys"] = _set_keys(data, given)
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


def with_overrides(config: RunConfig, overrides: dict[str, Any], *, given: bool = True) -> RunConfig:
    """A copy of `config` with dotted-key overrides applied and validated again; `given`: they count as set by the
    user (`RunConfig.set_keys`), as `--set` does."""
    data = config.to_dict()
    for key, value in overrides.items():
        _set_path(data, key.split("."), value)
    if given:
        data["set_keys"] = _set_keys(data, [*config.set_keys, *_leaves(overrides)])
    return from_dict(data)


# ---- a lineage's shape keys ---------------------------------------------------------------------
SOURCES = ("set", "lineage", "default")
"""Where a shape key's value comes from (`config_sources`): the config file or `--set`, the published model, or the
preset and the code's defaults."""


def shape_keys() -> tuple[str, ...]:
    """The keys a lineage keeps: the `model` fields declared `Role.SHAPE` and `store.embedding_dim`.  Another value
    of one does not fit the published model's dense weights (or rows): `trainer.model_dir.warm_start`."""
    model = [f"model.{n}" for n, d in declarations(ModelConfig).items() if d.role is Role.SHAPE]
    return (*model, "store.embedding_dim")


def lineage_values(meta: ModelMeta) -> dict[str, Any]:
    """The shape keys' values the published model `meta` was trained with, as plain data, where known: its
    model.json `model_config`, a key added since at the value it stood for before it existed, and its `dim`."""
    saved = with_absent_values(meta.model_config, ModelConfig)
    model = {key: key.removeprefix("model.") for key in shape_keys() if key.startswith("model.")}
    return {**{key: saved[name] for key, name in model.items() if name in saved}, "store.embedding_dim": meta.dim}


def lineage_config(cfg: RunConfig, meta: ModelMeta | None) -> tuple[RunConfig, dict[str, tuple[Any, Any]]]:
    """`cfg` continuing the lineage whose published model is `meta`, and the pins that changed a value (key ->
    (the lineage's value, `cfg`'s)).

    Each shape key that `cfg` does not set (`RunConfig.set_keys`) takes the value the model was trained with,
    so the day warm-starts its dense part whatever today's defaults are; a key the user sets keeps its value
    (`trainer.model_dir.warm_start` then says whether it starts the dense part cold).  No `meta` (a new
    lineage): `cfg`.  Values that `cfg` refuses together (a kept `model.num_heads` that does not divide a set
    `store.embedding_dim`) leave `cfg` as it is, with a warning, and the warm stage says why the dense part
    starts cold.
    """
    if meta is None:
        return cfg, {}
    data = cfg.to_dict()
    pins = {key: value for key, value in lineage_values(meta).items() if key not in cfg.set_keys}
    kept = {k: (_plain(v), _plain(_value(data, k))) for k, v in pins.items() if _plain(v) != _plain(_value(data, k))}
    try:
        return with_overrides(cfg, pins, given=False), kept
    except ConfigError as exc:
        log.warning("the published model's shape keys do not fit this config (%s): kept none of them", exc)
        return cfg, {}


def config_sources(cfg: RunConfig, meta: ModelMeta | None) -> dict[str, str]:
    """Where each shape key's value in `cfg` (a `lineage_config`) came from (`SOURCES`): `set` when the config
    file or `--set` gave it, `lineage` when it is the published model `meta`'s value, else `default`."""
    data, saved = cfg.to_dict(), lineage_values(meta) if meta is not None else {}
    return {
        key: "set"
        if key in cfg.set_keys
        else "lineage"
        if key in saved and _plain(saved[key]) == _plain(_value(data, key))
        else "default"
        for key in shape_keys()
    }


def kept_line(version: str, kept: dict[str, tuple[Any, Any]]) -> str:
    """The run's line for the pins of `lineage_config` that changed a value."""
    keys = ", ".join(f"{k}={_plain(lineage)} (default {_plain(default)})" for k, (lineage, default) in kept.items())
    return (
        f"lineage: {version} was trained with {keys}; kept, so the dense part warm-starts "
        "(set a key in the config to change it: the dense part then starts cold)"
    )


def _value(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node[part]
    return node


def _plain(value: Any) -> Any:
    """A value as JSON has it (tuples are lists)."""
    return json.loads(json.dumps(value))


def _leaves(data: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of the values in `data` (a nested mapping of sections, or dotted keys)."""
    out: list[str] = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        out += _leaves(value, f"{name}.") if isinstance(value, dict) and value else [name]
    return out


def _set_keys(data: dict[str, Any], given: list[str]) -> list[str]:
    """`RunConfig.set_keys`: the keys given, with those `data` already names, sorted once each."""
    return sorted((set(given) | set(data.get("set_keys", ()))) - {"set_keys"})


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
