"""`TrainSummary`: what a torchrun job trained, as rank 0 writes it and the launcher reads it back.

Rank 0 gathers every rank's counters at the end of training (`trainer.commit.write_model`), builds one
`TrainSummary` and stores `to_dict()` as model.json's `train` section (`trainer.model_dir.ModelMeta.train`,
a plain dict so that model.json stays readable by code of any version).  Every reader of that section
goes through `TrainSummary.from_dict`: the launcher after the job (`trainer.launch.torchrun.run_training`) and
the train stage when it reuses a committed candidate (`flows.day.stages.committed_candidate`), both via
`trainer.launch.torchrun.TrainResult.committed`.

The section is flat JSON: the typed fields below, then the communication and store counters
(`stats`) beside them, as model.json has always held them.  Reading is tolerant: a field an older
rank did not write takes its default (0, NaN for the losses, None), and a key this code does not
name stays in `stats`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from storage.embedding.pressure import StorePressure


@dataclass(frozen=True, kw_only=True)
class TrainSummary:
    """The totals of one training job over all its ranks (model.json `train`)."""

    steps: int = 0
    """Optimizer steps of each rank (every rank runs the same number)."""
    epochs: int = 0
    examples: int = 0
    """Examples trained, all ranks and epochs together."""
    dropped_rows: int = 0
    """Rows of the day no rank trained (the remainder of an even split, `trainer.data.rank_share`)."""
    sampled_out: int = 0
    """Negative rows the keep-rate left out (`optim.negative_sampling`; 0 at 1.0)."""
    carried: dict[str, Any] | None = None
    """The parent's eval rows trained first, `{date, rows}` (`trainer.plan.parent_eval`), or None."""
    final_loss: float = math.nan
    """Mean over the ranks of each rank's last step's loss."""
    mean_loss: float = math.nan
    """Mean loss over every step of every rank."""
    train_s: float = 0.0
    """Seconds the slowest rank trained (a resumed run counts the runs it resumes)."""
    examples_per_s: float = 0.0
    world_size: int = 0
    backend: str | None = None
    """The process group's backend (`none` for a world of one)."""
    device: str | None = None
    resumed_from_step: int = 0
    """Step of the checkpoint the job resumed from (0: a fresh start)."""
    prefetch_depth: int = 0
    """Batches the reader thread ran ahead (0: no thread)."""
    attention_kernel: str | None = None
    """The attention kernel that ran the training forwards (`trainer.models.attention_cpu.KERNELS`: `compiled`,
    `torch-ops`, `plain`; kernels that ran on different ranks or steps joined by `+`, most forwards first; `none`:
    a model without attention); None in records written before it was recorded."""
    stats: dict[str, Any] = field(default_factory=dict)
    """Everything else the ranks counted: dense and sparse traffic, cache hits, groups, store counters."""

    def __post_init__(self) -> None:
        clash = sorted(set(self.stats) & _TYPED)
        if clash:
            raise ValueError(f"TrainSummary.stats repeats the typed fields {clash}; set them as fields")

    def to_dict(self) -> dict[str, Any]:
        """The flat model.json `train` section."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "stats"}
        if out["attention_kernel"] is None:  # a record from before it was recorded writes back as it was
            del out["attention_kernel"]
        if not out["sampled_out"]:  # likewise a day that sampled nothing
            del out["sampled_out"]
        return {**out, **self.stats}

    def store_pressure(self) -> StorePressure | None:
        """The host hit rate, SSD bytes and wait, evictions of the job's stores (`stats["store_stats"]`, per rank);
        None for a record without them."""
        ranks = self.stats.get("store_stats")
        return StorePressure.of(ranks, examples=self.examples, train_s=self.train_s) if ranks else None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TrainSummary:
        """The summary of a model.json `train` section written by this code or an older one.

        Raises:
            ValueError: a typed field holds a value of the wrong kind (e.g. `steps: "x"`).
        """
        data = dict(data or {})
        typed: dict[str, Any] = {}
        for name, kind in _KINDS.items():
            if (value := data.pop(name, None)) is None:
                continue
            try:
                typed[name] = kind(value)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"model.json train.{name} must be {kind.__name__}, got {value!r}") from exc
        return cls(**typed, stats=data)


_KINDS: dict[str, Any] = {
    "steps": int,
    "epochs": int,
    "examples": int,
    "dropped_rows": int,
    "sampled_out": int,
    "carried": dict,
    "final_loss": float,
    "mean_loss": float,
    "train_s": float,
    "examples_per_s": float,
    "world_size": int,
    "backend": str,
    "device": str,
    "resumed_from_step": int,
    "prefetch_depth": int,
    "attention_kernel": str,
}
"""How each typed field is read back from JSON."""
_TYPED = frozenset(_KINDS)
