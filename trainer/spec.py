"""The train spec: the one JSON file the launcher writes and every rank of `trainer.main` reads."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from storage.config import StoreConfig
from trainer.config import ModelConfig, TrainerConfig

_C = TypeVar("_C")


def config_from_dict(cls: type[_C], data: dict[str, Any], *, section: str) -> _C:
    """Build a config dataclass from JSON data (lists become tuples where the field is a tuple).

    Raises:
        ValueError: unknown keys (named) or invalid values (the config's own message).
    """
    if not isinstance(data, dict):
        raise ValueError(f"spec.{section} must be an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"spec.{section} has unknown keys {unknown}; known: {sorted(fields)}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """What one training run needs; see `trainer.launch.run_training` for the meaning of each field."""

    features_url: str
    output_url: str
    init_model_url: str | None
    local_dir: str
    model_name: str
    storage_options: dict[str, Any] | None
    store: StoreConfig
    model: ModelConfig
    trainer: TrainerConfig
    run_tag: str
    vocab_date: str | None
    checkpoint_url: str | None = None
    """Directory of this run's checkpoints (shared by every node); None = no checkpoints."""
    warm: dict[str, Any] | None = None
    """What a rank needs to warm its own shard when the flow did not (see `trainer.warmup`); None = skip."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
        missing = sorted(required - set(data))
        unknown = sorted(set(data) - known)
        if missing or unknown:
            raise ValueError(f"train spec: missing keys {missing}, unknown keys {unknown}")
        return cls(
            **{k: data[k] for k in (known & set(data)) - {"store", "model", "trainer"}},
            store=config_from_dict(StoreConfig, data["store"], section="store"),
            model=config_from_dict(ModelConfig, data["model"], section="model"),
            trainer=config_from_dict(TrainerConfig, data["trainer"], section="trainer"),
        )

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: str | Path) -> TrainSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
