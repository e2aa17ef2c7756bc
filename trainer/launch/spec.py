"""The train spec: the one JSON file the launcher writes and every rank of `trainer.main` reads.

The flow builds one `TrainSpec` and `trainer.launch.torchrun.run_training` takes it whole; nothing restates
its fields.  `identity()` names the trained result: the hash of what changes it (the config fields
declared `Role.SHAPE` or `Role.RESULT` in their sections, `storage.io.identity`, and the inputs: the
features, the model started from, the carried rows), so a rerun with another timeout, log interval or
checkpoint interval resumes from the same checkpoints.  `with_run_tag` names the run: date, parent
version and identity.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from storage.embedding.config import StoreConfig
from storage.io import codec
from storage.io.identity import identity_parts
from storage.warm import WarmPlan
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.models.config import ModelConfig


@dataclass(frozen=True, kw_only=True)
class CarriedRows:
    """Rows a day trains on before its own: the eval split of the features its start model was gated on
    (`trainer.plan.parent_eval`)."""

    features_url: str
    """That day's committed features (their files), holding `eval/`."""
    features_id: str
    """Their manifest's run id: part of `TrainSpec.identity()`."""
    date: str
    rows: int
    evicted_url: str | None
    """This day's vocabulary's evicted keys: read as the field's OOV key in these rows."""


@dataclass(frozen=True, kw_only=True)
class TrainSpec:
    """What one training run needs."""

    features_url: str
    """The day's committed features directory (holding `train/` and `_SUCCESS.json`)."""
    output_url: str
    """The model directory to commit (e.g. `<root>/runs/<model>/date=D/model`)."""
    init_model_url: str | None
    """A previous model directory to warm-start the dense parameters and Adam state from, or None."""
    local_dir: str
    """Node-local folder of the store shards (`storage.io.layout.NodeLayout`)."""
    model_name: str
    storage_options: dict[str, Any] | None
    """fsspec options for every URL."""
    store: StoreConfig
    model: ModelConfig
    optim: OptimConfig
    het: HetConfig
    trainer: TrainerConfig
    run_tag: str
    """Written into the shards and model.json: the date, the parent version and `identity()`."""
    vocab_date: str | None
    """The vocabulary the features were encoded with (recorded in model.json)."""
    features_id: str = ""
    """What identifies the features' content (their manifest's run id): part of `identity()`."""
    checkpoint_url: str | None = None
    """Directory of this run's checkpoints (shared by every node); None = no checkpoints."""
    warm: WarmPlan | None = None
    """What a rank needs to warm its own shard when the flow did not (`storage.warm.ensure_warm`)."""
    carried: CarriedRows | None = None
    """Rows trained before the day's own in every epoch (the parent's eval rows), or None."""
    recipe: dict[str, Any] = field(default_factory=dict)
    """How `optim` was derived for the day's size (`trainer.plan.recipe.Recipe.record`), for model.json; not
    part of `identity()`, which hashes the values themselves."""
    config_sources: dict[str, str] = field(default_factory=dict)
    """Where each shape key's value came from (`set`, `lineage`, `default`: `flows.config.config_sources`), for
    model.json; not part of `identity()`, which hashes the values themselves."""

    def identity(self) -> str:
        """A short hash of everything that changes the trained model (and nothing that does not).

        Each section contributes the fields it declares to change the result (`identity_parts`); the
        section keys `rows` (store) and `world` (trainer) are the names earlier tags were hashed under,
        kept so that a rerun after an upgrade finds its checkpoints and committed candidate.

        Raises:
            TypeError: a section's field declares no role.
        """
        parts: dict[str, Any] = {
            "model": identity_parts(self.model),
            "optim": identity_parts(self.optim),
            "het": identity_parts(self.het),
            "rows": identity_parts(self.store),
            "world": identity_parts(self.trainer),
            "features": self.features_id or self.features_url,
            "init_model_url": self.init_model_url,
        }
        if self.carried is not None:  # absent otherwise: a run without carried rows keeps the tag it had before them
            parts["carried"] = self.carried.features_id or self.carried.features_url
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:10]

    def with_run_tag(self, date: str, parent: str | None) -> TrainSpec:
        """This spec named for a run on `date` from the published version `parent` (None: from scratch).

        The tag `date:parent:identity` is what a rerun looks for: the checkpoints and the committed
        candidate of a run with the same tag are its own (`flows.day.stages.committed_candidate`).
        """
        return replace(self, run_tag=f"{date}:{parent or 'none'}:{self.identity()}")

    def to_dict(self) -> dict[str, Any]:
        return codec.encode(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainSpec:
        """The spec from its JSON data.

        Raises:
            ConfigError: a missing or unknown key, or an invalid value (named).
        """
        missing = [n for n in ("features_url", "output_url", "local_dir", "model_name", "run_tag") if n not in data]
        if missing:
            raise codec.ConfigError(f"train spec: missing keys {missing}")
        return codec.decode(cls, data, prefix="spec.")

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: str | Path) -> TrainSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))
