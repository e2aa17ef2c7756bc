"""Typed configuration of the model (the `model` section), and which of its fields reshape parameters.

`model.dropout` may be `auto` until `trainer.plan.recipe.derive` decides it for the day: `ResolvedModel` is the
section with it a number, what the modules read (`ModelConfig.resolved`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from storage.io.identity import result_field, shape_changes, shape_field
from trainer.config import AUTO, refuse_auto

ARCHS = ("attention", "lr", "dnn", "deepfm", "dcn_v2")
CROSS_INPUTS = ("tokens", "fields")
ATTENTION_INPUTS = ("tokens", "fields")
BAG_POOLINGS = ("mean", "sum", "none")
COMPANIONS = ("auto", "poly2", "off")
COMPANION_BLEND_WEIGHT = 0.5
"""`model.companion_blend_weight`'s default: the mean of the two logits."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    arch: str = shape_field("attention")
    """Architecture: `attention` (embeddings -> multi-head self-attention over fields -> MLP -> sigmoid),
    or a reference: `lr`, `dnn`, `deepfm`, `dcn_v2` (see trainer/models/reference.py)."""
    num_heads: int = shape_field(2)
    """Attention heads; must divide store.embedding_dim."""
    attention_layers: int = shape_field(1)
    """`attention` only: self-attention layers over the field (and dense bucket) tokens; 0 = none."""
    attention_input: str = result_field("fields", neutral="tokens")
    """`attention` only: what the attention layers attend over: `fields`, the sparse fields' tokens alone (the
    dense bucket tokens join them after the attention, as they are, on their way to the MLP), or `tokens`, the
    field and bucket tokens together (the attention before this key existed).  On Criteo's 26 fields and 13
    dense columns `fields` is (26/39)^2 of the attention's work, for the same or better AUC
    (`docs/reports/2026-12-04-dense-step.md`).
    Reshapes no parameter: a change keeps the warm start."""
    mlp_dims: tuple[int, ...] = shape_field((256, 128))
    """Hidden widths of the MLP on top of the attended field embeddings and the dense features."""
    dropout: str | float = result_field(AUTO)
    """Dropout after each hidden MLP layer (and in attention); `auto`: 0 for one pass over the day, more
    for each further pass (`trainer.plan.recipe`)."""
    dense_buckets: int = shape_field(16)
    """Bucketise each log1p dense feature into this many buckets with a learned token each (0 = off,
    else >= 3); bucket 0 holds x <= 0 and missing values, which encode maps to the same 0.  The raw
    log1p values are used as well."""
    dense_bucket_max: float = shape_field(
        12.0, why="moves the bucket edges: the saved bucket tokens would mean other values"
    )
    """Upper edge, on the log1p scale, of the last closed dense bucket (values above share one bucket)."""
    cross: bool = shape_field(True, before=False, why="a model saved before the field has no cross term")
    """`attention` only: add a DCN-V2 cross network's logit on the flattened tokens `cross_input` names
    (`trainer.models.layers.CrossTerm`): explicit pairwise crosses of the embeddings, which the MLP only
    approximates.  Its output layer starts at zero; `optim.cross_lr_scale` decides whether a day trains it.
    A model published before the term existed lacks its weights: the first day with it starts its dense
    part cold (embedding rows kept; the record says `architecture changed: model.cross`); `false` keeps
    the earlier network and its warm start."""
    cross_input: str = shape_field(
        "fields", neutral="tokens", before="tokens", why="the cross term's input width: its saved layers would not fit"
    )
    """`attention` only: what the cross term crosses: `fields`, the sparse fields' tokens (F*D wide; the
    dense features reach the logit through the attention, the MLP and the wide term), or `tokens`, the
    field and dense bucket tokens (F'*D, the term before this key existed).  Its cost grows with the
    square of the width: on Criteo's 26 fields and 13 bucket tokens `fields` is 0.44x its FLOPs, for the
    same AUC (`docs/reports/2026-12-04-dense-step.md`).  A lineage keeps its published model's value unless the
    config sets the key (`flows.config.lineage_config`): a model published with `tokens` does not fit `fields`, so
    setting `fields` on its lineage starts the dense part cold once (embedding rows kept; the record says
    `architecture changed: model.cross_input tokens -> fields`)."""
    cross_layers: int = shape_field(3)
    """Cross layers of `dcn_v2` and of the `attention` model's cross term."""
    cross_rank: int = shape_field(0)
    """Rank r of every cross layer (`dcn_v2`, `model.cross`), W = U V^T (DCN-V2's low-rank form; 0 = full
    rank d x d)."""
    wide: bool = shape_field(True)
    """`attention` only: add a wide (logistic-regression) term to the logit, sum_f e_f[0] + <a, dense>,
    so memorised per-key weights and the deep interactions are learned together (Wide & Deep)."""
    wide_scale: float = shape_field(1.0, why="scales the saved key weights' logit: they were learned for another scale")
    """The wide term uses wide_scale * e_f[0]: the key weights' effective step (sparse_lr * wide_scale)
    and L2 (embedding_l2 / wide_scale^2, in logit units) apart from the deep dimensions'."""
    bag_pooling: str = result_field("mean")
    """How a multi-valued field's bag of keys (`bag_j` in features) becomes the field's one embedding row:
    `mean` or `sum` of the bag's rows (an empty bag uses the missing key's row), or `none` to ignore the
    bags and use the first value's key `k_j`.  Reshapes no parameter: a change keeps the warm start."""
    companion: str = result_field("auto", neutral="off", why="blends a second learner's logit into every score")
    """A second learner beside the network, its logit blended with the network's by every scorer
    (`companion_blend_weight`): a Poly2
    logistic regression with a weight per key, per pair of a row's keys and dense buckets, and per field for
    how often the key was seen in its rows (`trainer.companion.key_counts`), fit to convergence after the day's
    training on every row so far but the day's eval rows (`trainer.companion`; the newest `companion_rows`), C
    by 3-fold forward-chaining cross-validation of them.  It reads each value's own key (`r_<j>`).  `auto`:
    on a day of fewer than 10,000 train rows (`trainer.plan.recipe.CROSS_MIN_ROWS`, the days too small for the
    cross term) whose features carry the own keys (`encode.raw_keys_up_to`), none on larger days; `poly2`: on
    every day (needs `encode.raw_keys: true`); `off`: never.  It pays on small days and not on larger ones, where it
    costs train time (`docs/reports/2026-12-05-companion.md`); its fit's cost grows with the rows.
    Reshapes no parameter: a change keeps the warm start."""
    companion_rows: int = result_field(50_000, neutral=50_000, why="which rows the companion is fit on")
    """The most rows the companion is fit on: the newest ones of the days so far (today's train rows first)."""
    companion_blend_weight: float = result_field(
        COMPANION_BLEND_WEIGHT, neutral=COMPANION_BLEND_WEIGHT, why="weighs the two logits of every score"
    )
    """The network's weight w in a score's logit, w * network + (1 - w) * companion: recorded in model.json (a
    record without it reads 0.5).  0.5: the rolling benchmark told no weight from it (docs/benchmarks.md)."""

    def __post_init__(self) -> None:
        if self.dense_buckets < 0 or 0 < self.dense_buckets < 3:
            raise ValueError(f"model.dense_buckets must be 0 (off) or >= 3, got {self.dense_buckets}")
        if self.wide_scale <= 0:
            raise ValueError(f"model.wide_scale must be > 0, got {self.wide_scale}")
        if self.dense_bucket_max <= 0 or self.cross_layers < 0 or self.cross_rank < 0:
            raise ValueError("model.dense_bucket_max must be > 0, model.cross_layers and model.cross_rank >= 0")
        if self.bag_pooling not in BAG_POOLINGS:
            raise ValueError(f"model.bag_pooling must be one of {BAG_POOLINGS}, got {self.bag_pooling!r}")
        if self.attention_input not in ATTENTION_INPUTS:
            raise ValueError(f"model.attention_input must be one of {ATTENTION_INPUTS}, got {self.attention_input!r}")
        if self.cross_input not in CROSS_INPUTS:
            raise ValueError(f"model.cross_input must be one of {CROSS_INPUTS}, got {self.cross_input!r}")
        if self.companion not in COMPANIONS:
            raise ValueError(f"model.companion must be one of {COMPANIONS}, got {self.companion!r}")
        if self.companion_rows < 100:
            raise ValueError(f"model.companion_rows must be >= 100, got {self.companion_rows}")
        if isinstance(self.companion_blend_weight, bool) or not 0.0 <= self.companion_blend_weight <= 1.0:
            raise ValueError(
                f"model.companion_blend_weight must be a number in [0, 1] (the network's logit weight), got "
                f"{self.companion_blend_weight!r}"
            )
        if self.arch not in ARCHS:
            raise ValueError(f"model.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.num_heads < 1 or self.attention_layers < 0:
            raise ValueError("model.num_heads must be >= 1 and model.attention_layers >= 0")
        if not self.mlp_dims or any(d < 1 for d in self.mlp_dims):
            raise ValueError(f"model.mlp_dims must be positive widths, got {self.mlp_dims}")
        if self.dropout != AUTO:
            try:
                if isinstance(self.dropout, bool):
                    raise ValueError
                dropout = float(self.dropout)  # YAML/CLI text -> a number
            except (TypeError, ValueError):
                raise ValueError(
                    f"model.dropout must be {AUTO!r} or a number in [0, 1), got {self.dropout!r}"
                ) from None
            object.__setattr__(self, "dropout", dropout)
            if not 0.0 <= dropout < 1.0:
                raise ValueError(f"model.dropout must be in [0, 1), got {dropout}")

    def unresolved(self) -> list[str]:
        """The `model.*` keys still `auto` (`trainer.plan.recipe.derive` resolves them for the day)."""
        return ["model.dropout"] if self.dropout == AUTO else []

    def resolved(self) -> ResolvedModel:
        """This section as the resolved type (itself when it is one): what the modules are built from.

        Raises:
            ValueError: `model.dropout` is still `auto`.
        """
        if isinstance(self, ResolvedModel):
            return self
        return ResolvedModel(**{f.name: getattr(self, f.name) for f in fields(self)})


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedModel(ModelConfig):
    """The `model` section with `dropout` a number (`trainer.plan.recipe.derive`, `ModelConfig.resolved`); its
    fields and their roles are the section's."""

    dropout: float = field(metadata=dict(next(f.metadata for f in fields(ModelConfig) if f.name == "dropout")))

    def __post_init__(self) -> None:
        ModelConfig.__post_init__(self)
        refuse_auto(self.unresolved())


ATTENTION_ONLY = ("num_heads", "attention_layers", "attention_input", "cross", "cross_input", "wide", "wide_scale")
"""The fields only the `attention` architecture reads (the reference archs build none of their modules)."""


def unread_fields(config: ModelConfig) -> tuple[str, ...]:
    """The fields `config`'s architecture does not read (trainer/models/ctr_model.py, reference.py): a
    saved model that differs only in them has the same parameters.

    Each depends only on fields that are always read when it matters (`arch`, `cross`, `wide`,
    `dense_buckets`), so two configs that agree on those agree on what is unread.
    """
    unread: list[str] = []
    if config.arch != "attention":
        unread += ATTENTION_ONLY
        if config.arch != "dcn_v2":
            unread += ["cross_layers", "cross_rank"]
        if config.arch == "lr":
            unread.append("mlp_dims")
    else:
        if not config.cross:
            unread += ["cross_input", "cross_layers", "cross_rank"]
        if not config.wide:
            unread.append("wide_scale")
    if not config.dense_buckets:  # no bucket tokens: the edges are never used, the attention sees the fields alone
        unread.append("dense_bucket_max")
        if config.arch == "attention":
            unread.append("attention_input")
    return tuple(unread)


def reshaping_changes(saved: dict[str, Any] | None, ours: ModelConfig) -> list[str]:
    """The `model.*` keys whose saved value (a model.json `model_config`) differs from `ours`: a non-empty
    list means the saved dense weights do not fit `ours`.

    The fields compared are those declared `Role.SHAPE` that `ours` reads (`unread_fields`).  A field
    the saved config lacks (a model from before it existed) counts as changed unless ours holds the value
    it declares for then (`cross`: false); a saved key ours does not know counts as changed
    (`storage.io.identity.shape_changes`).
    """
    return shape_changes(saved, ours, prefix="model.", unread=unread_fields(ours))
