"""The `publish` section: what the publish gate (`flows.guards.gate`) refuses, what it does when the evidence
cannot decide, and how long a run waits for the model's slot."""

from __future__ import annotations

from dataclasses import dataclass

UNDECIDED_POLICIES = ("keep", "publish")
"""`publish.on_undecided`."""
LEAK_AUC = 0.999
"""The gate's leakage check refuses an eval AUC of at least this..."""
LEAK_ENTROPY_SHARE = 0.1
"""...with a logloss under this share of the click rate's entropy (the logloss of predicting the click rate)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishConfig:
    """The `publish` section: what the gate refuses, what it does undecided, how long a run waits for the slot."""

    max_auc_drop: float = 0.01
    """Refuse to publish when the new model's AUC is below the published one's by more than this."""
    min_eval_rows: int = 100
    """Refuse to publish a model evaluated on fewer rows than this."""
    lock_timeout_s: float = 6 * 3600
    """How long a run waits for another run of the same model to finish training/publishing before failing."""
    min_auc: float = 0.55
    """Refuse a model whose AUC is below this, the first model too (a day too small to learn from)."""
    max_logloss_increase: float = 0.01
    """Refuse when the logloss is above the published model's by more than this (absolute): a model can keep
    its ranking and lose its probabilities."""
    calibration_range: tuple[float, ...] = (0.8, 1.25)
    """[low, high]: refuse when mean prediction / click rate is outside (bids are priced from the probability)."""
    slice_fields: tuple[str, ...] = ()
    """Categorical fields (e.g. `[C1]`) whose values are slices of the eval rows, each gated like the AUC."""
    min_slice_rows: int = 1000
    """Only slices with at least this many eval rows are gated (smaller ones are noise)."""
    max_slice_auc_drop: float = 0.02
    """Refuse when any gated slice's AUC is below the published model's on it by more than this."""
    gauc_field: str = ""
    """A categorical field (e.g. a user id) to compute GAUC over and gate; empty: no GAUC."""
    max_gauc_drop: float = 0.01
    """Refuse when the GAUC is below the published model's by more than this."""
    allow_older: bool = False
    """Publish a model trained on a date older than the one LATEST was trained through (`--allow-older`)."""
    noise_sds: float = 2.0
    """Every check comparing numbers (auc_drop, logloss, calibration, slices, gauc) refuses only a
    difference that also exceeds this many standard errors of it on the eval rows: on a few hundred eval
    rows two equally good models differ by more than the thresholds by chance, and the click rate a
    calibration divides by is uncertain by more than calibration_range allows.  Where they exceed a
    threshold, a change within them is undecided.  0 = the thresholds alone."""
    on_undecided: str = "keep"
    """When even the pooled eval rows cannot decide: `keep` LATEST (refused as `undecided: ...`) or
    `publish`; a first model is published."""
    pool_days: int = 7
    """Where the day's eval rows cannot decide, the gate adds those of the last `pool_days` dates neither
    model trained on (`flows.guards.pool`)."""
    allow_leak: bool = False
    """Publish an eval AUC >= 0.999 with a logloss near 0 (a leak)."""

    def __post_init__(self) -> None:
        for name in ("max_auc_drop", "max_logloss_increase", "max_slice_auc_drop", "max_gauc_drop", "noise_sds"):
            if getattr(self, name) < 0:
                raise ValueError(f"publish.{name} must be >= 0, got {getattr(self, name)}")
        if self.min_eval_rows < 1:
            raise ValueError(f"publish.min_eval_rows must be >= 1, got {self.min_eval_rows}")
        if self.lock_timeout_s <= 0:
            raise ValueError(f"publish.lock_timeout_s must be > 0, got {self.lock_timeout_s}")
        if not 0.0 <= self.min_auc < 1.0:
            raise ValueError(f"publish.min_auc must be in [0, 1), got {self.min_auc}")
        low_high = self.calibration_range
        if len(low_high) != 2 or not 0 <= low_high[0] <= 1 <= low_high[1]:
            raise ValueError(f"publish.calibration_range must be [low <= 1, high >= 1], got {list(low_high)}")
        if self.min_slice_rows < 1:
            raise ValueError(f"publish.min_slice_rows must be >= 1, got {self.min_slice_rows}")
        if self.on_undecided not in UNDECIDED_POLICIES:
            raise ValueError(f"publish.on_undecided must be one of {UNDECIDED_POLICIES}, got {self.on_undecided!r}")
        if self.pool_days < 1:
            raise ValueError(f"publish.pool_days must be >= 1 (1 = the day's eval rows alone), got {self.pool_days}")

    def group_fields(self) -> tuple[str, ...]:
        """The fields the evaluation must compute per-group AUCs for."""
        return tuple(dict.fromkeys((*self.slice_fields, *([self.gauc_field] if self.gauc_field else []))))
