"""The model directory: the format every trained model is committed in, and its typed `model.json`.

    model.json               `ModelMeta`: architecture, configs, columns, lineage pointers, train stats
    dense.safetensors        the dense network's state_dict
    dense_optim.safetensors  `<param>.exp_avg`, `<param>.exp_avg_sq` per parameter, and `step`
    sparse/part-RRRRR.parquet  rank R's embedding rows: key, emb, m, v, clock (storage.embedding.snapshot)
    companion.safetensors    with `model.companion`: the companion's weights (`trainer.companion`)
    _SUCCESS.json            written last (on an object store the files sit under its data prefix)

Safetensors, JSON and Parquet only: a model directory never holds pickles.  `ModelMeta` is the one
reader and writer of `model.json`; `warm_start` decides, in one place, whether a run may start from
a saved model.

model.json outlives the code that wrote it (`read_published` reads it at the start of every day; a
scorer reads a newer trainer's), so `ModelMeta` is its own record schema, read tolerantly
(`storage.io.records`): the config sections are kept as plain data, and `model_cfg()` decodes
`model_config` into today's `ModelConfig` when a network is built, skipping retired keys and giving new
ones the value they stood for before they existed (else their defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from storage.embedding.config import StoreConfig
from storage.io import codec, fsio, records
from storage.io.identity import with_absent_values
from trainer.companion.model import blend_weight_of
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.eval.metrics import PROB_EPS
from trainer.models.config import ModelConfig, reshaping_changes
from trainer.models.ctr_model import CTRModel

MODEL_JSON = "model.json"
DENSE = "dense.safetensors"
DENSE_OPTIM = "dense_optim.safetensors"
SPARSE = "sparse"
MODEL = records.RecordFormat(
    "ctr-pipeline-model", 4, reads=(2, 3, 4), fix="retrain the model (or read it with the release that wrote it)"
)
"""model.json: version 2 is a model without a companion (what every model before it held); version 3 one with
a companion of the pairs alone (`ModelMeta.companion`, `trainer.companion`); version 4 one whose companion also
counts its keys (`trainer.companion.key_counts`: the counts are in its file).  A reader must blend the companion
into every score, with its counts: a release that reads version 2 alone refuses 3 and 4, and one that reads up
to 3 refuses 4, instead of scoring without them.  This code writes 2 or 4; a version 3 model scores as it was
fit (its companion's file has no counts)."""
MODEL_FORMAT = f"{MODEL.name}/2"
WITH_COMPANION = MODEL.tag

join = fsio.join


def sparse_part_name(rank: int) -> str:
    return f"part-{rank:05d}.parquet"


@dataclass(frozen=True, kw_only=True)
class ModelMeta:
    """`model.json` of a model directory (`ModelMeta.of` builds one from the live config sections)."""

    format: str = MODEL_FORMAT
    model_name: str
    model_config: dict[str, Any]
    """The `model.*` values trained with, as plain data (`model_cfg()`: as a `ModelConfig`)."""
    dim: int
    """Embedding width."""
    init_std: float
    """Std of the initial rows of keys the model never trained (`storage.embedding.rows.initial`)."""
    num_dense: int
    num_fields: int
    fields: tuple[str, ...]
    dense_columns: tuple[str, ...]
    key_columns: tuple[str, ...]
    bag_columns: tuple[str, ...] = ()
    """Pooled with `model_config.bag_pooling` (empty: no multi-valued fields)."""
    vocab_date: str | None
    """The vocabulary the training rows were encoded with."""
    run_tag: str
    """Names the trained result (date, parent version, `TrainSpec.identity`); the shards carry it too."""
    features_url: str
    init_model_url: str | None
    """The model this one warm-started from, or None."""
    optim: dict[str, Any] = field(default_factory=dict)
    """The `optim.*` values trained with (a record: keys of other code versions are kept as they are)."""
    het: dict[str, Any] = field(default_factory=dict)
    trainer: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    """Train statistics (steps, examples, losses, rates, communication, store counters)."""
    recipe: dict[str, Any] = field(default_factory=dict)
    """The `optim` values derived for the day's size and why (`trainer.plan.recipe.Recipe.record`)."""
    config_sources: dict[str, str] = field(default_factory=dict)
    """Where each shape key's value came from: `set` (the config file or --set), `lineage` (the published model it
    started from), `default` (`flows.config.config_sources`); empty in a model.json from before it was recorded."""
    companion: dict[str, Any] | None = None
    """The companion's record (`trainer.companion.fit.fit_for_spec`: kind, C, rows, sources, the fit's convergence;
    `blend_weight`, the network's weight in every score), or None: without one the model scores by its network
    alone."""
    score_eps: float = PROB_EPS
    """Every score is clipped to [score_eps, 1 - score_eps] (`trainer.eval.metrics.clip_probabilities`), in
    evaluation and serving alike; a model.json from before it was recorded reads the default."""
    negative_sampling: float = 1.0
    """The keep-rate of negatives it trained with (`optim.negative_sampling`): scores are corrected by log(w) in
    logit (`trainer.sampling`); a model.json from before it was recorded reads 1.0 (no correction)."""

    @classmethod
    def of(
        cls, *, model_config: ModelConfig, optim: OptimConfig, het: HetConfig, trainer: TrainerConfig, **fields: Any
    ) -> ModelMeta:
        """The record of a model trained with these live config sections (stored as plain data).

        A companion's record gets the network's blend weight trained with (`model.companion_blend_weight`), which
        every scorer reads from it (`companion_blend_weight`)."""
        if fields.get("companion"):
            fields["companion"] = {**fields["companion"], "blend_weight": model_config.companion_blend_weight}
        return cls(
            model_config=codec.encode(model_config),
            optim=codec.encode(optim),
            het=codec.encode(het),
            trainer=codec.encode(trainer),
            **fields,
        )

    @property
    def companion_blend_weight(self) -> float:
        """The network's logit weight in every score of a model with a companion (its record's `blend_weight`;
        0.5, the mean, in a record from before it was recorded).

        Raises:
            ValueError: the record has none (`companion` is None) or a weight out of [0, 1].
        """
        if not self.companion:
            raise ValueError(f"{self.run_tag or 'the model'}: model.json records no companion: nothing to blend")
        return blend_weight_of(self.companion, f"model.json of {self.run_tag or 'the model'}")

    def model_cfg(self) -> ModelConfig:
        """`model_config` as today's `ModelConfig`: retired keys skipped, keys added since at the value they
        stood for before they existed (`before`/`neutral`, e.g. `cross_input: tokens`), else their defaults.
        A default that changed with the key's arrival must not rebuild an old model with another shape.

        Raises:
            ConfigError: a value today's `ModelConfig` refuses (the message names the key).
        """
        return codec.decode(
            ModelConfig,
            with_absent_values(self.model_config, ModelConfig),
            prefix="model.json: model_config.",
            unknown="ignore",
        )

    @property
    def arch(self) -> str:
        return self.model_cfg().arch

    def to_dict(self) -> dict[str, Any]:
        return {**codec.encode(self), "format": WITH_COMPANION if self.companion else MODEL_FORMAT}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = MODEL_JSON) -> ModelMeta:
        """The record in a model.json's content, fields this code does not know ignored.

        Raises:
            FormatError: not a model.json of a version this code reads (the message says what to do).
            ConfigError: a known field of the wrong type (named).
        """
        return records.read_record(cls, data, fmt=MODEL, where=where)


def read_meta(model_url: str, storage_options: dict | None = None) -> ModelMeta:
    """The `ModelMeta` of a committed model directory.

    Raises:
        FileNotFoundError: the directory is not committed (no `_SUCCESS.json`) or has no model.json.
    """
    fs, path = fsio.get_fs(model_url, storage_options)
    if (manifest := fsio.read_manifest(fs, path)) is None:
        raise FileNotFoundError(f"{model_url} is not a committed model directory (no {fsio.SUCCESS})")
    where = fsio.join(model_url, MODEL_JSON)
    return ModelMeta.from_dict(fsio.read_json(fs, fsio.join(fsio.data_dir(path, manifest), MODEL_JSON)), where=where)


def load_network(model_url: str, meta: ModelMeta, storage_options: dict | None = None) -> CTRModel:
    """The dense network of the committed model directory at `model_url` (its files), in eval mode."""
    model = CTRModel(meta.model_cfg(), num_dense=meta.num_dense, num_fields=meta.num_fields, dim=meta.dim)
    model.load_state_dict(read_tensors(fsio.join(model_url, DENSE), storage_options))
    return model.eval()


def write_meta(fs: Any, path: str, meta: ModelMeta) -> None:
    """Write `meta` as `<path>/model.json` (`path` on `fs`, protocol-less)."""
    fsio.write_json(fs, fsio.join(path, MODEL_JSON), meta.to_dict())


def write_tensors(url: str, tensors: dict[str, torch.Tensor], storage_options: dict | None = None) -> None:
    fs, path = fsio.get_fs(url, storage_options)
    data = st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    with fs.open(path, "wb") as f:
        f.write(data)


def read_tensors(url: str, storage_options: dict | None = None) -> dict[str, torch.Tensor]:
    fs, path = fsio.get_fs(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(url)
    with fs.open(path, "rb") as f:
        return st_load(f.read())


@dataclass(frozen=True)
class WarmStart:
    """Whether a run may start from a saved model: its dense weights, its rows, and why not."""

    dense: bool
    sparse: bool
    reason: str = ""
    changed: tuple[str, ...] = ()
    """The keys whose value does not fit the saved model (`model.cross_input`, `store.embedding_dim`)."""


def warm_start(saved: ModelMeta, model: ModelConfig, store: StoreConfig) -> WarmStart:
    """Can a run with `model` and `store` start from `saved`?

    A config change that reshapes the network (another arch, MLP widths, dense buckets, ...) or the
    rows (embedding_dim) must not fail every daily run until someone intervenes: the affected part
    starts cold, and the run's record says so, naming each key with the saved value and the run's.  Only the
    `model` fields declared `Role.SHAPE` that the architecture reads are compared (`reshaping_changes`): dropout
    and bag pooling reshape nothing.  A lineage's day keeps the saved values of the keys its config does not set
    (`flows.config.lineage_config`), so only a key the user sets (or a saved value this code refuses) gets here.
    """
    changed = reshaping_changes(saved.model_config, model)
    sparse_ok = saved.dim == store.embedding_dim
    if not sparse_ok:
        changed.append("store.embedding_dim")
    if changed:
        theirs = {**with_absent_values(saved.model_config, ModelConfig), "embedding_dim": saved.dim}
        ours = {**codec.encode(model), "embedding_dim": store.embedding_dim}
        values = [
            f"{k} {_shown(theirs.get(k.split('.')[-1]))} -> {_shown(ours.get(k.split('.')[-1]))}" for k in changed
        ]
        return WarmStart(False, sparse_ok, "architecture changed: " + ", ".join(values), tuple(changed))
    return WarmStart(True, True)


def _shown(value: Any) -> str:
    """A config value as a message shows it (lists as YAML writes them inline, a missing one as `-`)."""
    if value is None:
        return "-"
    return "[" + ", ".join(map(str, value)) + "]" if isinstance(value, list | tuple) else str(value)
