"""The publish gate: whether the day's candidate may replace the published model.

Pure: it sees the candidate's metrics and the published model's on the same eval rows, and the
`publish` section of the config; the publish stage records its decision either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.metrics import EvalMetrics


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishConfig:
    """The `publish` section: what the gate refuses, and how long a run waits for the model's slot."""

    max_auc_drop: float = 0.01
    """Refuse to publish when the new model's AUC is below the published one's by more than this."""
    min_eval_rows: int = 100
    """Refuse to publish a model evaluated on fewer rows than this."""
    lock_timeout_s: float = 6 * 3600
    """How long a run waits for another run of the same model to finish training/publishing before failing."""

    def __post_init__(self) -> None:
        if self.max_auc_drop < 0:
            raise ValueError(f"publish.max_auc_drop must be >= 0, got {self.max_auc_drop}")
        if self.min_eval_rows < 1:
            raise ValueError(f"publish.min_eval_rows must be >= 1, got {self.min_eval_rows}")
        if self.lock_timeout_s <= 0:
            raise ValueError(f"publish.lock_timeout_s must be > 0, got {self.lock_timeout_s}")


@dataclass(frozen=True, slots=True)
class GateDecision:
    publish: bool
    reason: str


def gate(new: EvalMetrics, published: EvalMetrics | None, cfg: PublishConfig) -> GateDecision:
    """Decide whether the candidate may replace the published model; the reason is recorded either way."""
    auc, loss = new.auc, new.logloss
    if not (math.isfinite(auc) and math.isfinite(loss)):
        return GateDecision(False, f"candidate metrics are not finite (auc={auc}, logloss={loss})")
    if new.rows < cfg.min_eval_rows:
        return GateDecision(
            False, f"eval set has {new.rows} rows, fewer than publish.min_eval_rows={cfg.min_eval_rows}"
        )
    if published is None:
        return GateDecision(True, "first model")
    drop = published.auc - auc
    if drop > cfg.max_auc_drop:
        return GateDecision(False, (
            f"AUC {auc:.4f} is {drop:.4f} below the published model's {published.auc:.4f} on the same rows "
            f"(publish.max_auc_drop={cfg.max_auc_drop})"
        ))
    return GateDecision(True, f"AUC {auc:.4f} vs published {published.auc:.4f}")
