"""The publish gate: whether the day's candidate may replace the published model.

Pure: it sees the candidate's metrics and the published model's on the same eval rows (overall,
per slice, per group), the dates both were trained through, and the `publish` section of the config.
Every check is recorded with its value and threshold, passed or not; the candidate is published only
when all pass, and the reason of a refusal names every check that refused.

    finite       AUC and logloss are numbers
    eval_rows    at least publish.min_eval_rows eval rows
    min_auc      an absolute floor, for the first model too
    calibration  mean prediction / click rate within publish.calibration_range (and the noise)
    dates        not trained on a date older than the one LATEST was trained through (unless allow_older)
    auc_drop     AUC not below the published model's by more than publish.max_auc_drop (and the noise)
    logloss      logloss not above the published model's by more than publish.max_logloss_increase (and the noise)
    slices       no slice (value of a publish.slice_fields field) with >= min_slice_rows rows dropping
                 more than publish.max_slice_auc_drop (and the noise)
    gauc         with publish.gauc_field: GAUC not below the published model's by more than max_gauc_drop
                 (and the noise)

Every comparison decides on evidence.  On a small day's few hundred eval rows two equally good models
differ by 0.02 in AUC by chance, and a click rate of 66 clicks in 333 rows is itself uncertain by 0.022,
which would keep a small model from ever being published.  So a check refuses only a difference that
exceeds both its threshold and publish.noise_sds standard errors of it on the eval rows, and its reason
prints the interval (the value +- noise_sds standard errors):

    auc_drop, logloss  the paired standard errors of the differences, row by row (`trainer.eval.paired`)
    calibration        the click rate's binomial sd: refused only when the whole interval of mean
                       prediction / click rate lies outside the range (`flows.guards.noise`), the
                       first model too
    slices, gauc       each slice's (group's) paired DeLong standard error of the two models' AUC
                       difference on its rows (`trainer.eval.group_metrics.paired_group_se`); where the
                       evaluation has none, both models' Hanley-McNeil errors as if independent (an
                       upper bound, which never refuses on noise but lets a little more through)

At production eval sizes the standard errors are far below the thresholds and change nothing.
min_auc stays an absolute floor (a model that learnt nothing is not published on a day too small to
show it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flows.guards.noise import calibration_interval, click_rate_sd, hanley_mcneil_se
from trainer.eval.group_metrics import GroupAUC
from trainer.eval.metrics import EvalMetrics
from trainer.eval.paired import Difference


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
    """Every check comparing numbers (auc_drop, logloss, calibration, slices, gauc) refuses only a
    difference that also exceeds this many standard errors of it on the eval rows: on a few hundred eval
    rows two equally good models differ by more than the thresholds by chance, and the click rate a
    calibration divides by is uncertain by more than calibration_range allows.  0 = the thresholds alone."""

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
    interval: list[float] | None = None
    """[low, high]: what the check compares, +- publish.noise_sds standard errors: the drop or rise for
    auc_drop, logloss, slices (the worst slice) and gauc, the calibration for calibration (through the
    click rate's interval); None when its noise is unknown or noise_sds is 0.  A list, as metrics.json
    reads it back."""

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


def gate(
    new: Scores,
    published: Scores | None,
    cfg: PublishConfig,
    *,
    versus: Difference | None = None,
    versus_groups: dict[str, dict[Any, float]] | None = None,
) -> GateDecision:
    """Decide whether the candidate may replace the published model; the reason is recorded either way.

    `versus`: the candidate minus the published model row by row on the same eval rows
    (`flows.guards.evaluation.Evaluation.versus`); without it the thresholds alone decide.
    `versus_groups`: per slice or GAUC field, value -> the standard error of the two models' AUC
    difference on that value's rows, paired (`Evaluation.versus_groups`); without it (or for a value
    it lacks) the slices and GAUC take both models' Hanley-McNeil errors as independent, an upper bound.
    """
    m = new.metrics
    auc, loss = m.auc, m.logloss
    if not (math.isfinite(auc) and math.isfinite(loss)):
        bad = GateCheck("finite", False, None, None, f"candidate metrics are not finite (auc={auc}, logloss={loss})")
        return GateDecision(False, bad.detail, (bad,))
    checks = [
        _check(
            "eval_rows",
            m.rows >= cfg.min_eval_rows,
            m.rows,
            cfg.min_eval_rows,
            f"eval set has {m.rows} rows, fewer than publish.min_eval_rows={cfg.min_eval_rows}",
        ),
        _check(
            "min_auc", auc >= cfg.min_auc, auc, cfg.min_auc, f"AUC {auc:.4f} is below publish.min_auc={cfg.min_auc}"
        ),
        _calibration(m, cfg),
    ]
    if published is not None:
        checks.append(_dates(new, published, cfg))
        p = published.metrics
        checks += [
            _difference(
                "auc_drop",
                p.auc - auc,
                versus.auc_se if versus else None,
                cfg.max_auc_drop,
                cfg,
                f"AUC {auc:.4f} is {{value:.4f}} below the published model's {p.auc:.4f} on the same rows "
                f"(publish.max_auc_drop={cfg.max_auc_drop}",
            ),
            _difference(
                "logloss",
                loss - p.logloss,
                versus.logloss_se if versus else None,
                cfg.max_logloss_increase,
                cfg,
                f"logloss {loss:.4f} is {{value:.4f}} above the published model's {p.logloss:.4f} "
                f"(publish.max_logloss_increase={cfg.max_logloss_increase}",
            ),
        ]
        paired = versus_groups or {}
        checks += [_slices(name, new, published, cfg, paired.get(name, {})) for name in cfg.slice_fields]
        if cfg.gauc_field:
            checks.append(_gauc(new, published, cfg, paired.get(cfg.gauc_field, {})))
    failed = [c for c in checks if not c.passed]
    if failed:
        return GateDecision(False, "; ".join(c.detail for c in failed), tuple(checks))
    if published is None:
        return GateDecision(True, "first model", tuple(checks))
    return GateDecision(True, f"AUC {auc:.4f} vs published {published.metrics.auc:.4f}", tuple(checks))


def _noise(cfg: PublishConfig, se: float | None) -> float:
    """publish.noise_sds standard errors of a difference (0 when unknown or undefined)."""
    return cfg.noise_sds * se if se is not None and math.isfinite(se) else 0.0


def _noise_text(cfg: PublishConfig, value: float, noise: float) -> str:
    if not noise:
        return ""
    return (
        f", {cfg.noise_sds:g} standard errors of the difference on these rows = {noise:.4f}: "
        f"[{value - noise:.4f}, {value + noise:.4f}]"
    )


def _check(
    name: str, passed: bool, value: Any, threshold: Any, why: str, interval: tuple[float, float] | None = None
) -> GateCheck:
    """A check whose detail says why it refuses, or `ok`."""
    return GateCheck(
        name,
        passed,
        value,
        threshold,
        "ok" if passed else why,
        None if interval is None else [float(interval[0]), float(interval[1])],
    )


def _difference(name: str, value: float, se: float | None, limit: float, cfg: PublishConfig, why: str) -> GateCheck:
    """A difference (larger = worse) that refuses above max(limit, noise_sds standard errors); `why` is
    formatted with the value and closed with the noise's interval."""
    noise = _noise(cfg, se)
    threshold = max(limit, noise)
    return _check(
        name,
        value <= threshold,
        value,
        threshold,
        why.format(value=value) + _noise_text(cfg, value, noise) + ")",
        (value - noise, value + noise) if noise else None,
    )


def _calibration(m: EvalMetrics, cfg: PublishConfig) -> GateCheck:
    """Refused when the interval of the calibration, from the click rate's noise, misses the range: a
    calibration outside the range that the click count cannot tell from one inside it passes."""
    low, high = cfg.calibration_range
    lo, hi = calibration_interval(m, cfg.noise_sds)
    ok = math.isfinite(m.calibration) and hi >= low and lo <= high
    noise = (
        f" [{lo:.3f}, {hi:.3f}] at {cfg.noise_sds:g} sd of the click rate ({click_rate_sd(m):.4f} on "
        f"{m.rows} rows, {round(m.click_rate * m.rows)} clicks)"
        if cfg.noise_sds
        else ""
    )
    return _check(
        "calibration",
        ok,
        m.calibration,
        list(cfg.calibration_range),
        f"calibration (mean prediction {m.mean_prediction:.4f} / click rate {m.click_rate:.4f}) is "
        f"{m.calibration:.3f}{noise}, outside publish.calibration_range=[{low}, {high}]",
        (lo, hi) if cfg.noise_sds and math.isfinite(lo) else None,
    )


def _dates(new: Scores, published: Scores, cfg: PublishConfig) -> GateCheck:
    latest, date = published.trained_through, new.trained_through
    older = latest is not None and date is not None and date < latest
    return _check(
        "dates",
        not older or cfg.allow_older,
        date,
        latest,
        f"older than LATEST (trained through {latest}); pass --allow-older (publish.allow_older) to publish it anyway",
    )


def _slices(name: str, new: Scores, published: Scores, cfg: PublishConfig, paired: dict[Any, float]) -> GateCheck:
    mine, theirs = new.groups[name], published.groups[name]
    big_mine, big_theirs = mine.slices(cfg.min_slice_rows), theirs.slices(cfg.min_slice_rows)
    se = _difference_se(mine, theirs, paired)
    drops = {
        v: big_theirs[v][1] - a
        for v, (_, a) in big_mine.items()
        if v in big_theirs and math.isfinite(a) and math.isfinite(big_theirs[v][1])
    }
    noise = {v: _noise(cfg, se[v]) for v in drops}
    limit = {v: max(cfg.max_slice_auc_drop, noise[v]) for v in drops}
    worst = max(drops, key=lambda v: drops[v] - limit[v], default=None)  # the nearest to refusing
    value = drops[worst] if worst is not None else 0.0
    over = sorted((v for v, d in drops.items() if d > limit[v]), key=lambda v: -(drops[v] - limit[v]))
    band = noise[worst] if worst is not None else 0.0
    detail = (
        f"{len(over)} slice(s) of {name} with >= {cfg.min_slice_rows} rows lost more than "
        f"publish.max_slice_auc_drop={cfg.max_slice_auc_drop} AUC and {cfg.noise_sds:g} standard errors "
        f"(worst: key {worst}, -{value:.4f} [{value - band:.4f}, {value + band:.4f}], "
        f"{big_mine[worst][0] if worst is not None else 0} rows)"
        if over
        else f"{len(drops)} slice(s) of {name} with >= {cfg.min_slice_rows} rows; largest AUC drop "
        f"{max(drops.values(), default=0.0):.4f}"
    )
    return GateCheck(
        f"slices:{name}",
        not over,
        value,
        limit[worst] if worst is not None else cfg.max_slice_auc_drop,
        detail,
        [value - band, value + band] if band else None,
    )


def _difference_se(mine: GroupAUC, theirs: GroupAUC, paired: dict[Any, float]) -> dict[Any, float]:
    """value -> standard error of the two models' AUC difference on its rows: the paired one where known,
    else both Hanley-McNeil errors as if independent (an upper bound)."""
    se_mine = hanley_mcneil_se(mine.auc, mine.clicks, mine.rows - mine.clicks)
    se_theirs = dict(
        zip(
            (v.item() for v in theirs.values),
            hanley_mcneil_se(theirs.auc, theirs.clicks, theirs.rows - theirs.clicks),
            strict=True,
        )
    )
    out = {}
    for v, e in zip(mine.values, se_mine, strict=True):
        key = v.item()
        p = paired.get(key, math.nan)
        out[key] = float(p) if math.isfinite(p) else math.hypot(float(e), float(se_theirs.get(key, math.nan)))
    return out


def _gauc_difference_se(mine: GroupAUC, theirs: GroupAUC, paired: dict[Any, float]) -> float:
    """Standard error of the difference of two click-weighted means of the groups' AUCs on the same rows
    (groups independent of each other; within a group `_difference_se`)."""
    se = _difference_se(mine, theirs, paired)
    both = np.isfinite(mine.auc)
    errors = np.array([se[v.item()] for v in mine.values[both]])
    w = mine.clicks[both].astype(np.float64)
    ok = np.isfinite(errors)
    return float(np.sqrt((w[ok] ** 2 * errors[ok] ** 2).sum()) / w.sum()) if w.sum() else math.nan


def _gauc(new: Scores, published: Scores, cfg: PublishConfig, paired: dict[Any, float]) -> GateCheck:
    mine_g, theirs_g = new.groups[cfg.gauc_field], published.groups[cfg.gauc_field]
    mine, theirs = mine_g.gauc(), theirs_g.gauc()
    drop = theirs - mine if math.isfinite(mine) and math.isfinite(theirs) else 0.0
    noise = _noise(cfg, _gauc_difference_se(mine_g, theirs_g, paired))
    threshold = max(cfg.max_gauc_drop, noise)
    return _check(
        "gauc",
        drop <= threshold,
        mine,
        threshold,
        f"GAUC over {cfg.gauc_field} {mine:.4f} is {drop:.4f} below the published model's {theirs:.4f} "
        f"(publish.max_gauc_drop={cfg.max_gauc_drop}{_noise_text(cfg, drop, noise)})",
        (drop - noise, drop + noise) if noise else None,
    )
