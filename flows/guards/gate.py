"""The publish gate: whether the day's candidate may replace the published model.

Pure: it sees the candidate's metrics and the published model's on the same eval rows (overall,
per slice, per group), the dates both were trained through, and the `publish` section of the config.
Every check is recorded with its value and threshold, passed or not; the candidate is published only
when all pass, and the reason of a refusal names every check that refused.

    finite       AUC and logloss are numbers
    eval_rows    at least publish.min_eval_rows eval rows
    min_auc      an absolute floor, for the first model too
    calibration  mean prediction / click rate within publish.calibration_range
    dates        not trained on a date older than the one LATEST was trained through (unless allow_older)
    auc_drop     AUC not below the published model's by more than publish.max_auc_drop (and the noise)
    logloss      logloss not above the published model's by more than publish.max_logloss_increase (and the noise)
    slices       no slice (value of a publish.slice_fields field) with >= min_slice_rows rows dropping
                 more than publish.max_slice_auc_drop
    gauc         with publish.gauc_field: GAUC not below the published model's by more than max_gauc_drop

auc_drop and logloss compare two numbers measured on the same eval rows.  On a small day's few
hundred rows they differ by 0.02 by chance, which would keep a small model from ever improving;
given the paired standard errors of the differences (`trainer.paired`), a difference also has to
exceed publish.noise_sds of them to refuse.  At production eval sizes the standard errors are far
below the thresholds and change nothing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.group_metrics import GroupAUC
from trainer.metrics import EvalMetrics
from trainer.paired import Difference


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishConfig:
    """The `publish` section: what the gate refuses, and how long a run waits for the model's slot."""

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
    """The auc_drop and logloss checks refuse only a difference that also exceeds this many standard
    errors of it (paired, on the same eval rows): on a few hundred eval rows two equally good models
    differ by more than the thresholds by chance.  0 = the thresholds alone."""

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

    def group_fields(self) -> tuple[str, ...]:
        """The fields the evaluation must compute per-group AUCs for."""
        return tuple(dict.fromkeys((*self.slice_fields, *([self.gauc_field] if self.gauc_field else []))))


@dataclass(frozen=True)
class Scores:
    """What the gate sees of one model on the day's eval rows."""

    metrics: EvalMetrics
    groups: dict[str, GroupAUC] = field(default_factory=dict)
    """Per field of `PublishConfig.group_fields`: the AUC of each of its values."""
    trained_through: str | None = None
    """The last date the model was trained on."""


@dataclass(frozen=True, slots=True)
class GateCheck:
    name: str
    passed: bool
    value: Any
    threshold: Any
    detail: str
    """Why it refuses (`ok` when it passed)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GateDecision:
    publish: bool
    reason: str
    checks: tuple[GateCheck, ...] = ()

    def values(self) -> list[dict[str, Any]]:
        """The checks as records (the day's record and the version's metrics.json)."""
        return [c.to_dict() for c in self.checks]


def gate(new: Scores, published: Scores | None, cfg: PublishConfig, *, versus: Difference | None = None) -> GateDecision:
    """Decide whether the candidate may replace the published model; the reason is recorded either way.

    `versus`: the candidate minus the published model row by row on the same eval rows
    (`flows.guards.evaluation.Evaluation.versus`); without it the thresholds alone decide.
    """
    m = new.metrics
    auc, loss = m.auc, m.logloss
    if not (math.isfinite(auc) and math.isfinite(loss)):
        bad = GateCheck("finite", False, None, None, f"candidate metrics are not finite (auc={auc}, logloss={loss})")
        return GateDecision(False, bad.detail, (bad,))
    checks = [
        _check("eval_rows", m.rows >= cfg.min_eval_rows, m.rows, cfg.min_eval_rows,
                  f"eval set has {m.rows} rows, fewer than publish.min_eval_rows={cfg.min_eval_rows}"),
        _check("min_auc", auc >= cfg.min_auc, auc, cfg.min_auc,
                  f"AUC {auc:.4f} is below publish.min_auc={cfg.min_auc}"),
        _calibration(m, cfg),
    ]
    if published is not None:
        checks.append(_dates(new, published, cfg))
        p = published.metrics
        drop, rise = p.auc - auc, loss - p.logloss
        auc_noise = _noise(cfg, versus.auc_se if versus else None)
        loss_noise = _noise(cfg, versus.logloss_se if versus else None)
        checks += [
            _check("auc_drop", drop <= max(cfg.max_auc_drop, auc_noise), drop, max(cfg.max_auc_drop, auc_noise),
                      f"AUC {auc:.4f} is {drop:.4f} below the published model's {p.auc:.4f} on the same rows "
                      f"(publish.max_auc_drop={cfg.max_auc_drop}{_noise_text(cfg, auc_noise)})"),
            _check("logloss", rise <= max(cfg.max_logloss_increase, loss_noise), rise,
                      max(cfg.max_logloss_increase, loss_noise),
                      f"logloss {loss:.4f} is {rise:.4f} above the published model's {p.logloss:.4f} "
                      f"(publish.max_logloss_increase={cfg.max_logloss_increase}{_noise_text(cfg, loss_noise)})"),
        ]
        checks += [_slices(name, new, published, cfg) for name in cfg.slice_fields]
        if cfg.gauc_field:
            checks.append(_gauc(new, published, cfg))
    failed = [c for c in checks if not c.passed]
    if failed:
        return GateDecision(False, "; ".join(c.detail for c in failed), tuple(checks))
    if published is None:
        return GateDecision(True, "first model", tuple(checks))
    return GateDecision(True, f"AUC {auc:.4f} vs published {published.metrics.auc:.4f}", tuple(checks))


def _noise(cfg: PublishConfig, se: float | None) -> float:
    """publish.noise_sds standard errors of a difference (0 when unknown or undefined)."""
    return cfg.noise_sds * se if se is not None and math.isfinite(se) else 0.0


def _noise_text(cfg: PublishConfig, noise: float) -> str:
    return f", {cfg.noise_sds:g} standard errors of the difference on these rows = {noise:.4f}" if noise else ""


def _check(name: str, passed: bool, value: Any, threshold: Any, why: str) -> GateCheck:
    """A check whose detail says why it refuses, or `ok`."""
    return GateCheck(name, passed, value, threshold, "ok" if passed else why)


def _calibration(m: EvalMetrics, cfg: PublishConfig) -> GateCheck:
    low, high = cfg.calibration_range
    ok = math.isfinite(m.calibration) and low <= m.calibration <= high
    return _check("calibration", ok, m.calibration, list(cfg.calibration_range),
                     f"calibration (mean prediction {m.mean_prediction:.4f} / click rate {m.click_rate:.4f}) is "
                     f"{m.calibration:.3f}, outside publish.calibration_range=[{low}, {high}]")


def _dates(new: Scores, published: Scores, cfg: PublishConfig) -> GateCheck:
    latest, date = published.trained_through, new.trained_through
    older = latest is not None and date is not None and date < latest
    return _check("dates", not older or cfg.allow_older, date, latest,
                     f"older than LATEST (trained through {latest}); pass --allow-older (publish.allow_older) "
                     "to publish it anyway")


def _slices(name: str, new: Scores, published: Scores, cfg: PublishConfig) -> GateCheck:
    mine, theirs = new.groups[name].slices(cfg.min_slice_rows), published.groups[name].slices(cfg.min_slice_rows)
    drops = {v: theirs[v][1] - a for v, (_, a) in mine.items()
             if v in theirs and math.isfinite(a) and math.isfinite(theirs[v][1])}
    worst = max(drops, key=lambda v: drops[v], default=None)
    value = drops[worst] if worst is not None else 0.0
    over = sorted((v for v, d in drops.items() if d > cfg.max_slice_auc_drop), key=lambda v: -drops[v])
    detail = (f"{len(over)} slice(s) of {name} with >= {cfg.min_slice_rows} rows lost more than "
              f"publish.max_slice_auc_drop={cfg.max_slice_auc_drop} AUC (worst: key {worst}, -{value:.4f}, "
              f"{mine[worst][0] if worst is not None else 0} rows)" if over else
              f"{len(drops)} slice(s) of {name} with >= {cfg.min_slice_rows} rows; largest AUC drop {value:.4f}")
    return GateCheck(f"slices:{name}", not over, value, cfg.max_slice_auc_drop, detail)


def _gauc(new: Scores, published: Scores, cfg: PublishConfig) -> GateCheck:
    mine, theirs = new.groups[cfg.gauc_field].gauc(), published.groups[cfg.gauc_field].gauc()
    drop = theirs - mine if math.isfinite(mine) and math.isfinite(theirs) else 0.0
    return _check("gauc", drop <= cfg.max_gauc_drop, mine, cfg.max_gauc_drop,
                     f"GAUC over {cfg.gauc_field} {mine:.4f} is {drop:.4f} below the published model's {theirs:.4f} "
                     f"(publish.max_gauc_drop={cfg.max_gauc_drop})")
