"""The training values a day's size decides: `derive(optim, model, rows=..., world_size=...) -> Recipe`.

A production day (10^8 rows) is 10^4-10^5 steps at batch 1024 and needs none of this: one pass, the
base learning rates, no extra regularisation, 100 warm-up steps.  A small day (a local run, the first
day of a new model, a small traffic segment) at those values is a handful of steps, and the dense
network barely leaves its initialisation.  So every `auto` field of `OptimConfig` (and the model's
dropout) is derived here, in this order, from the rows per rank n = rows // world_size:

- batch_size: the largest power of two in [MIN_BATCH, the device's MAX_BATCH] with which one pass over
  n rows is at least BATCH_STEPS steps (MIN_BATCH when none is);
- epochs: 1 when that pass is at least MIN_STEPS steps, else the passes that reach MIN_STEPS, at
  most MAX_EPOCHS.  More passes over the same rows overfit them where one pass has the steps, while a
  day of a few dozen steps needs them (`docs/reports/2026-12-01-daily-recipe.md`);
- lr: BASE_LR * sqrt(LR_REF_STEPS / steps), within [BASE_LR, MAX_LR]: the dense network must
  travel as far in a few hundred steps as in 10^4;
- sparse_lr: BASE_SPARSE_LR / sqrt(epochs): a row met in every pass takes as large a step in
  total as in one pass.  A day of at most 50,000 train rows then has it replaced by the best of a
  few multiples, cross-validated on its rows (`trainer.plan.sparse_lr_search`, `trainer.plan.day_recipe`):
  the value that suits one dataset hurts another;
- embedding_l2 and model.dropout: L2_PER_EXTRA_EPOCH and DROPOUT_PER_EXTRA_EPOCH per pass after
  the first (L2 on the rows a batch touches, dropout in the MLP and attention, at most MAX_DROPOUT):
  the regularisation that stops the extra passes from memorising the day (the cosine decay of
  `optim.lr_decay` does the rest).  On small real days the MLP overfits first, so dropout grows fastest;
- warmup_steps: a tenth of the day's steps, at most WARMUP_CAP;
- cross_lr_scale: 1 on a day of at least CROSS_MIN_ROWS train rows, else 0: the `model.cross` term's
  crosses need rows to estimate: on days of a few thousand rows it fits noise and costs AUC, on larger
  ones it adds (`docs/reports/2026-12-02-cross-term.md`).  At 0 the term stays as it is: zero on a model that
  never trained it, whose predictions are then those of the model without it;
- wide_loss: WIDE_LOSS on a day of fewer than CROSS_MIN_ROWS train rows, else 0: on a small day the wide
  part (a logistic regression on the key weights inside the model) is trained to predict alone too, so
  the deep parts learn only what it misses; on larger days that costs them
  (`docs/reports/2026-12-03-wide-loss.md`).

An explicit value in the config always wins, and the fields after it are derived from it (a set
batch size decides the epochs that reach MIN_STEPS); an explicit warm-up is only cut to the day's
steps.  The flow derives the recipe once, where it builds the day's train spec (`flows.day.stages`),
because the run identity hashes the values actually trained with and every node's ranks read
that one spec; the ranks refuse a spec with a field still `auto`.  Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from trainer.config import AUTO, OptimConfig, ResolvedOptim
from trainer.models.config import ModelConfig, ResolvedModel

BATCH_STEPS = 500
"""Steps one pass should have: the batch shrinks (down to MIN_BATCH) until it does; fewer, larger steps
cost a large day AUC (`docs/reports/2026-12-01-daily-recipe.md`)."""
MIN_STEPS = 50
"""Optimizer steps a day must reach: a day whose one pass has fewer takes more passes."""
MIN_BATCH = 128
"""The smallest derived batch: on small days twice the steps of 256 gain AUC, smaller batches no more
(`docs/reports/2026-12-03-small-day-batch.md`)."""
MAX_BATCH = {"cpu": 1024, "cuda": 8192}
"""The largest derived batch per device type of the ranks: a CPU rank's production batch; a GPU rank needs
larger ones to spread each step's kernel launches and host work over more examples (issue 29's estimate for
an H200 at 1024: the device busy under 5% of the step), and its day reaches 8192 only where a pass still has
BATCH_STEPS steps (4M rows a rank).  Not yet measured on a GPU."""
MAX_EPOCHS = 3
BASE_LR = 1e-3
MAX_LR = 1e-2
LR_REF_STEPS = 10_000
"""A day of at least this many steps trains the dense network at BASE_LR."""
BASE_SPARSE_LR = 2e-2
L2_PER_EXTRA_EPOCH = 0.05
DROPOUT_PER_EXTRA_EPOCH = 0.25
MAX_DROPOUT = 0.5
"""Dropout of a day of MAX_EPOCHS passes, and of any more passes set in the config."""
WARMUP_CAP = 100
WARMUP_SHARE = 0.1
CROSS_MIN_ROWS = 10_000
"""Train rows from which a day trains the `model.cross` term (all ranks together), and under which it trains the
wide term's own loss (`optim.wide_loss`)."""
WIDE_LOSS = 1.0
"""`optim.wide_loss` of a day under CROSS_MIN_ROWS train rows: it gains on small days and costs on larger ones,
which train the model's loss alone (`docs/reports/2026-12-03-wide-loss.md`)."""


@dataclass(frozen=True)
class Recipe:
    """The resolved `optim` section (and model dropout) of a day, and what was derived from what."""

    optim: ResolvedOptim
    """Every field a number: what the ranks train with."""
    model: ResolvedModel
    """The model config with its dropout resolved."""
    rows: int
    world_size: int
    steps: int
    """Optimizer steps of the day (per rank)."""
    why: dict[str, str]
    """`optim.<field>` / `model.dropout` -> why it has its value, for every field that may be `auto`."""
    derived: tuple[str, ...]
    """The keys that were `auto` (the others were set in the config)."""
    searched: dict[str, float] = dataclasses.field(default_factory=dict)
    """Derived keys a search replaced (`with_value`) -> the factor over the rule's value, which a day warm-
    started from this model reuses (`trainer.plan.day_recipe`)."""

    def value(self, key: str) -> Any:
        """The resolved value of `optim.<field>` or `model.dropout`."""
        section, name = key.split(".", 1)
        return getattr(self.optim if section == "optim" else self.model, name)

    def with_value(self, key: str, value: Any, reason: str) -> Recipe:
        """The recipe with the derived `optim.<field>` `key` replaced (a search's choice, `trainer.plan.day_recipe`).

        Raises:
            ValueError: `key` was set in the config (an explicit value always wins) or is not an optim field.
        """
        section, name = key.split(".", 1)
        if section != "optim" or key not in self.derived:
            raise ValueError(f"only a derived optim value can be replaced, not {key} ({self.why.get(key, 'unknown')})")
        factor = float(f"{value / self.value(key):.3g}")
        return dataclasses.replace(
            self,
            optim=dataclasses.replace(self.optim, **{name: value}),
            why={**self.why, key: reason},
            searched={**self.searched, key: factor},
        )

    def record(self) -> dict[str, Any]:
        """The values and reasons, as model.json and metrics.json keep them."""
        return {
            "rows": self.rows,
            "world_size": self.world_size,
            "steps": self.steps,
            "values": {k: self.value(k) for k in self.why},
            "derived": list(self.derived),
            "why": dict(self.why),
            "searched": dict(self.searched),
        }

    def summary(self) -> str:
        """One line: the values for the day's size, `*` marking the derived ones (the train stage's line
        before it names the steps and ranks)."""
        values = " ".join(f"{k.split('.', 1)[1]}={self.value(k):g}{'*' if k in self.derived else ''}" for k in self.why)
        return f"recipe for {self.rows:,} rows: {values} (* derived)"


def derive(optim: OptimConfig, model: ModelConfig, *, rows: int, world_size: int, device: str = "cpu") -> Recipe:
    """Resolve every `auto` field of `optim` and `model` for a day of `rows` train rows over `world_size` ranks
    computing on `device` ("cpu" or "cuda": the batch's upper bound, MAX_BATCH).

    Raises:
        ValueError: rows < 1, world_size < 1 or an unknown device.

    Example::

        derive(OptimConfig(), ModelConfig(), rows=3_600, world_size=1).optim.epochs      # 3 (15 steps a pass)
        derive(OptimConfig(), ModelConfig(), rows=10**8, world_size=8).optim.batch_size  # 1024, 1 epoch, lr 1e-3
    """
    if rows < 1 or world_size < 1:
        raise ValueError(f"derive needs rows >= 1 and world_size >= 1, got rows={rows}, world_size={world_size}")
    if device not in MAX_BATCH:
        raise ValueError(f"derive knows the batch bounds of devices {sorted(MAX_BATCH)}, got {device!r}")
    max_batch = MAX_BATCH[device]
    n = max(1, rows // world_size)  # a rank's share (trainer.data.rank_share drops the remainder)
    picks = _Picks(optim, model)
    batch = picks.pick_int(
        "batch_size",
        _largest_batch(n, max_batch),
        f"{n:,} rows/rank on {device}: the largest batch in [{MIN_BATCH}, {max_batch}] whose "
        f"pass has at least {BATCH_STEPS} steps (or the smallest)",
    )
    one_pass = -(-n // batch)
    epochs = picks.pick_int(
        "epochs",
        min(MAX_EPOCHS, max(1, -(-MIN_STEPS // one_pass))),
        f"{one_pass} steps a pass: the passes reaching {MIN_STEPS} steps, at most {MAX_EPOCHS}",
    )
    steps = one_pass * epochs
    picks.pick_float(
        "lr",
        min(MAX_LR, max(BASE_LR, BASE_LR * math.sqrt(LR_REF_STEPS / steps))),
        f"{steps} steps: {BASE_LR:g} * sqrt({LR_REF_STEPS} / steps) within [{BASE_LR:g}, {MAX_LR:g}]",
    )
    picks.pick_float(
        "sparse_lr", BASE_SPARSE_LR / math.sqrt(epochs), f"{epochs} passes: {BASE_SPARSE_LR:g} / sqrt(epochs)"
    )
    picks.pick_float(
        "embedding_l2",
        L2_PER_EXTRA_EPOCH * (epochs - 1),
        f"{epochs} passes: {L2_PER_EXTRA_EPOCH:g} per pass after the first",
    )
    picks.pick_float(
        "dropout",
        min(MAX_DROPOUT, DROPOUT_PER_EXTRA_EPOCH * (epochs - 1)),
        f"{epochs} passes: {DROPOUT_PER_EXTRA_EPOCH:g} per pass after the first, at most {MAX_DROPOUT:g}",
        section="model",
    )
    picks.pick_float(
        "cross_lr_scale",
        1.0 if rows >= CROSS_MIN_ROWS else 0.0,
        f"{rows:,} train rows: 1 from {CROSS_MIN_ROWS:,} rows (enough to estimate crosses), else 0",
    )
    picks.pick_float(
        "wide_loss",
        WIDE_LOSS if rows < CROSS_MIN_ROWS else 0.0,
        f"{rows:,} train rows: {WIDE_LOSS:g} under {CROSS_MIN_ROWS:,} rows (the wide part must predict alone), else 0",
    )
    warmup = picks.pick_int(
        "warmup_steps",
        min(WARMUP_CAP, int(steps * WARMUP_SHARE)),
        f"{steps} steps: a tenth of them, at most {WARMUP_CAP}",
    )
    if warmup > steps:  # an explicit warm-up longer than the day would never reach the learning rate
        picks.values["optim.warmup_steps"] = steps
        picks.why["optim.warmup_steps"] = f"set in the config ({warmup}), cut to the day's {steps} steps"
    return picks.recipe(rows=rows, world_size=world_size, steps=steps)


def _largest_batch(n: int, max_batch: int) -> int:
    """The largest power of two in [MIN_BATCH, max_batch] whose pass over `n` rows has at least BATCH_STEPS steps
    (MIN_BATCH when none has)."""
    batch = MIN_BATCH
    while batch < max_batch and -(-n // (batch * 2)) >= BATCH_STEPS:
        batch *= 2
    return batch


class _Picks:
    """`derive`'s choices: for each field that may be `auto`, the config's number, or the rule's value when the
    field is `auto`, and why."""

    def __init__(self, optim: OptimConfig, model: ModelConfig) -> None:
        self.optim, self.model = optim, model
        self.why: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        """The derived values by key (`optim.<field>`, `model.dropout`)."""
        self.derived: list[str] = []

    def _pick(self, name: str, value: int | float, reason: str, section: str) -> int | float | str:
        key = f"{section}.{name}"
        given = getattr(self.optim if section == "optim" else self.model, name)
        if given == AUTO:
            value = float(f"{value:.3g}") if isinstance(value, float) else value  # 0.00685, not 0.006851892...
            self.values[key], self.why[key] = value, reason
            self.derived.append(key)
            return value
        self.why[key] = "set in the config"
        return given  # a number: the config's own (`OptimConfig` and `ModelConfig` turn text into numbers)

    def pick_int(self, name: str, value: int, reason: str) -> int:
        """The `optim` integer `name`: the config's, or `value` when it is `auto`."""
        return int(self._pick(name, value, reason, "optim"))

    def pick_float(self, name: str, value: float, reason: str, section: str = "optim") -> float:
        """The float `name` of `section`: the config's, or `value` when it is `auto`."""
        return float(self._pick(name, value, reason, section))

    def recipe(self, *, rows: int, world_size: int, steps: int) -> Recipe:
        """The recipe of these choices: the sections with every `auto` field replaced, as resolved types."""
        of = {
            s: {k.split(".", 1)[1]: v for k, v in self.values.items() if k.startswith(s + ".")}
            for s in ("optim", "model")
        }
        return Recipe(
            dataclasses.replace(self.optim, **of["optim"]).resolved(),
            dataclasses.replace(self.model, **of["model"]).resolved(),
            rows,
            world_size,
            steps,
            self.why,
            tuple(self.derived),
        )
