"""The publish gate: whether the day's candidate may replace the published model.

Pure: it sees the candidate's metrics on the day's eval rows, both models' as served on the rows they are
compared on (overall, per slice, per group: the day's eval rows, or the pooled ones of `flows.guards.pool`),
the dates both were trained through, and the `publish` section of the config.  Every check is recorded with
its value and threshold; its outcome is passed, refused or undecided, and so is the gate's verdict: refused
when a check refused (the reason names every one), else undecided when a check could not decide (then
publish.on_undecided says what happens), else passed.

    finite       AUC and logloss are numbers
    eval_rows    at least publish.min_eval_rows eval rows
    min_auc      an absolute floor, for the first model too
    calibration  mean prediction / click rate within publish.calibration_range (and the noise)
    leakage      not an AUC >= 0.999 with a logloss near 0 (unless publish.allow_leak)
    dates        not trained on a date older than the one LATEST was trained through (unless allow_older)
    auc_drop     AUC not below the published model's by more than publish.max_auc_drop (and the noise)
    logloss      logloss not above the published model's by more than publish.max_logloss_increase (and the noise)
    slices       no slice (value of a publish.slice_fields field) with >= min_slice_rows rows dropping
                 more than publish.max_slice_auc_drop (and the noise)
    gauc         with publish.gauc_field: GAUC not below the published model's by more than max_gauc_drop
                 (and the noise)
    served       in place of the four above when the published model cannot be scored as served: undecided

Every comparison decides on evidence.  On a small day's few hundred eval rows two equally good models
differ by 0.02 in AUC by chance, and a click rate of 66 clicks in 333 rows is itself uncertain by 0.022.
So a check refuses only a difference that exceeds both its threshold and publish.noise_sds (z) standard
errors (se) of it on the rows, and its reason prints the interval (the value +- z se).  The rows decide
auc_drop, logloss and gauc when z se <= the threshold: a change of the threshold itself would then show
beyond the noise, so a change within it is a pass.  Where z se > the threshold they still decide a
difference beyond z se (refused) and one whose interval ends within the threshold (passed: a better
candidate); anything else is undecided, never a pass (on 6 positives a 2-se rule once turned
max_auc_drop 0.01 into 0.26).  A first model's min_auc is undecided the same way when its AUC is within
z Hanley-McNeil errors above the floor (later models lean on the comparison).  A slice still passes a drop
within its noise: it is one of many subsets, and publish.min_slice_rows says which are big enough to gate.
The errors:

    auc_drop, logloss  the paired standard errors of the differences, row by row (`trainer.eval.paired`);
                       for the AUC where that is undefined, both models' Hanley-McNeil errors as if
                       independent (an upper bound); none at all (a single positive): undecided
    calibration        the click rate's binomial sd: refused only when the whole interval of mean
                       prediction / click rate lies outside the range (`flows.guards.noise`), the
                       first model too
    slices, gauc       each slice's (group's) paired DeLong standard error of the two models' AUC
                       difference on its rows (`trainer.eval.group_metrics.paired_group_se`); where the
                       evaluation has none, both models' Hanley-McNeil errors as if independent (an
                       upper bound, which never refuses on noise but lets a little more through)

At production eval sizes the standard errors are far below the thresholds and change nothing.
min_auc stays an absolute floor (a model that learnt nothing is not published on a day too small to
show it).  The published model is compared as served (with its companion); where that cannot be done its
comparisons are undecided, never made against its network alone (`Scores.unscored`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flows.guards.noise import calibration_interval, click_rate_sd, clicks, hanley_mcneil_se
from flows.guards.publish_config import LEAK_AUC, LEAK_ENTROPY_SHARE, PublishConfig

__all__ = ["GateCheck", "GateDecision", "PublishConfig", "Scores", "comparisons", "gate"]
from trainer.eval.group_metrics import GroupAUC
from trainer.eval.metrics import EvalMetrics
from trainer.eval.paired import Difference


@dataclass(frozen=True)
class Scores:
    """What the gate sees of one model on the day's eval rows."""

    metrics: EvalMetrics
    groups: dict[str, GroupAUC] = field(default_factory=dict)
    """Per field of `PublishConfig.group_fields`: the AUC of each of its values."""
    trained_through: str | None = None
    """The last date the model was trained on."""
    unscored: str = ""
    """Why the model could not be scored as served on any rows (its metrics are then not read): its
    comparisons are undecided (`Scores.not_served`)."""

    @classmethod
    def not_served(cls, why: str, trained_through: str | None) -> Scores:
        nan = math.nan
        return cls(EvalMetrics(nan, nan, 0, nan, nan, nan, nan), trained_through=trained_through, unscored=why)


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
    undecided: bool = False
    """The evidence could not decide it (`passed` is then False, and `detail` says why): not a refusal."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class GateDecision:
    publish: bool
    reason: str
    checks: tuple[GateCheck, ...] = ()
    verdict: str = "passed"
    """`passed`, `refused` or `undecided: <why>` (`publish` then follows publish.on_undecided)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """What the comparisons read: `rows`, `positives` and `auc_se` (the AUC difference's standard error;
    None when unknown); empty for a first model."""

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
    compared: Scores | None = None,
) -> GateDecision:
    """Decide whether the candidate may replace the published model; the reason is recorded either way.

    `new`: the candidate on the day's eval rows (the absolute checks read it).  `published`: the published
    model as served on the rows compared: the day's, or with `compared` (the candidate on them) the pooled
    eval rows (`flows.guards.pool`).
    `versus`: the candidate minus the published model row by row on the compared rows
    (`flows.guards.evaluation.Evaluation.versus`); without it the thresholds alone decide auc_drop and logloss.
    `versus_groups`: per slice or GAUC field, value -> the standard error of the two models' AUC
    difference on that value's rows, paired (`Evaluation.versus_groups`); without it (or for a value
    it lacks) the slices and GAUC take both models' Hanley-McNeil errors as independent, an upper bound.
    """
    m = new.metrics
    auc, loss = m.auc, m.logloss
    if not (math.isfinite(auc) and math.isfinite(loss)):
        bad = GateCheck("finite", False, None, None, f"candidate metrics are not finite (auc={auc}, logloss={loss})")
        return GateDecision(False, bad.detail, (bad,), "refused")
    checks = [
        _check(
            "eval_rows",
            m.rows >= cfg.min_eval_rows,
            m.rows,
            cfg.min_eval_rows,
            f"eval set has {m.rows} rows, fewer than publish.min_eval_rows={cfg.min_eval_rows}",
        ),
        _min_auc(m, cfg, first=published is None),
        _calibration(m, cfg),
        _leakage(m, cfg),
    ]
    if published is None:
        se = float(hanley_mcneil_se(auc, clicks(m), m.rows - clicks(m)))
        return _decision(checks, cfg, "first model", _evidence(m, se), first=True)
    checks.append(_dates(new, published, cfg))
    mine = compared or new
    checks += comparisons(mine, published, cfg, versus=versus, versus_groups=versus_groups)
    on = f" on {_rows(mine.metrics)}" if compared else ""
    passed = f"AUC {mine.metrics.auc:.4f} vs published {published.metrics.auc:.4f}{on}"
    se = _auc_se(mine.metrics, published.metrics, versus) if versus and not published.unscored else math.nan
    return _decision(checks, cfg, passed, _evidence(mine.metrics, se), first=False)


def comparisons(
    new: Scores,
    published: Scores,
    cfg: PublishConfig,
    *,
    versus: Difference | None = None,
    versus_groups: dict[str, dict[Any, float]] | None = None,
) -> list[GateCheck]:
    """The checks that compare the candidate with the published model, both scored on the same rows:
    auc_drop, logloss, the slices and gauc; when `published` could not be scored as served, in their place one
    undecided check, `served`."""
    if published.unscored:
        why = f"served: the published model cannot be scored as served: {published.unscored}"
        return [GateCheck("served", False, None, None, why, undecided=True)]
    m, p = new.metrics, published.metrics
    checks = [
        _difference(
            "auc_drop",
            p.auc - m.auc,
            _auc_se(m, p, versus) if versus else None,
            cfg.max_auc_drop,
            cfg,
            f"AUC {m.auc:.4f} is {{value:.4f}} below the published model's {p.auc:.4f} on the same rows "
            f"(publish.max_auc_drop={cfg.max_auc_drop}",
            m,
        ),
        _difference(
            "logloss",
            m.logloss - p.logloss,
            versus.logloss_se if versus else None,
            cfg.max_logloss_increase,
            cfg,
            f"logloss {m.logloss:.4f} is {{value:.4f}} above the published model's {p.logloss:.4f} "
            f"(publish.max_logloss_increase={cfg.max_logloss_increase}",
            m,
        ),
    ]
    paired = versus_groups or {}
    checks += [_slices(name, new, published, cfg, paired.get(name, {})) for name in cfg.slice_fields]
    if cfg.gauc_field:
        checks.append(_gauc(new, published, cfg, paired.get(cfg.gauc_field, {})))
    return checks


def _decision(
    checks: list[GateCheck], cfg: PublishConfig, passed: str, evidence: dict[str, Any], *, first: bool
) -> GateDecision:
    """The verdict of the checks: refused when one refused, else undecided when one could not decide (then
    publish.on_undecided; a first model is published), else passed.  A passed check's note (a calibration
    not judged) is added to the reason."""
    refused = [c for c in checks if not c.passed and not c.undecided]
    if refused:
        return GateDecision(False, "; ".join(c.detail for c in refused), tuple(checks), "refused", evidence)
    notes = "".join(f"; {c.name} {c.detail}" for c in checks if c.passed and c.detail != "ok")
    undecided = [c.detail for c in checks if c.undecided]
    if not undecided:
        return GateDecision(True, passed + notes, tuple(checks), "passed", evidence)
    verdict = "undecided: " + "; ".join(undecided)
    if first:
        publish, reason = True, f"first model, {verdict} (a first model is published: there is nothing to keep)"
    elif cfg.on_undecided == "publish":
        publish, reason = True, f"{verdict} (publish.on_undecided=publish)"
    else:
        publish, reason = False, f"{verdict}; LATEST kept (publish.on_undecided=keep)"
    return GateDecision(publish, reason + notes, tuple(checks), verdict, evidence)


def _evidence(m: EvalMetrics, auc_se: float) -> dict[str, Any]:
    return {"rows": m.rows, "positives": clicks(m), "auc_se": auc_se if math.isfinite(auc_se) else None}


def _rows(m: EvalMetrics) -> str:
    return f"{m.rows} rows ({clicks(m)} positives)"


def _auc_se(m: EvalMetrics, p: EvalMetrics, versus: Difference | None) -> float:
    """The standard error of the AUC difference: paired where known, else both models' Hanley-McNeil errors as
    if independent (an upper bound); NaN without 2 positives and 2 negatives."""
    if versus is not None and math.isfinite(versus.auc_se):
        return versus.auc_se
    pos, neg = clicks(m), m.rows - clicks(m)
    return math.hypot(float(hanley_mcneil_se(m.auc, pos, neg)), float(hanley_mcneil_se(p.auc, pos, neg)))


def _outcome(value: float, noise: float, limit: float) -> str:
    """`refused` beyond max(limit, noise); `passed` where the rows decide (noise <= limit: a change of `limit`
    would show) or the interval value +- noise ends within `limit`; else `undecided`."""
    if value > max(limit, noise):
        return "refused"
    return "passed" if noise <= limit or value + noise <= limit else "undecided"


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


def _difference(
    name: str, value: float, se: float | None, limit: float, cfg: PublishConfig, why: str, m: EvalMetrics
) -> GateCheck:
    """A difference (larger = worse) on the rows of `m`, decided by `_outcome` against noise_sds standard errors;
    without `se` (no pairing given) or with noise_sds 0, by the threshold alone; with an undefined one,
    undecided.  `why` (the refusal) is formatted with the value and closed with the noise's interval."""
    if se is not None and not math.isfinite(se) and cfg.noise_sds:
        return GateCheck(name, False, value, limit, f"{name}: no standard error of it on {_rows(m)}", undecided=True)
    noise = _noise(cfg, se)
    interval = [value - noise, value + noise] if noise else None
    outcome = _outcome(value, noise, limit)
    if outcome == "undecided":
        detail = (  # the rows' noise (noise_sds standard errors) exceeds what the check allows: no verdict
            f"{name} {value:+.4f} within noise {noise:.4f} ({cfg.noise_sds:g} se) on {_rows(m)}, over the {limit} "
            "allowed"
        )
        return GateCheck(name, False, value, limit, detail, interval, undecided=True)
    text = why.format(value=value) + _noise_text(cfg, value, noise) + ")"
    return GateCheck(
        name, outcome == "passed", value, max(limit, noise), "ok" if outcome == "passed" else text, interval
    )


def _calibration(m: EvalMetrics, cfg: PublishConfig) -> GateCheck:
    """Refused when the interval of the calibration, from the click rate's noise, misses the range: a
    calibration outside the range that the click count cannot tell from one inside it passes.  Too few
    clicks for an interval with an upper end: passed, `not judged: N clicks` (no range could refuse it)."""
    low, high = cfg.calibration_range
    interval = calibration_interval(m, cfg.noise_sds)
    if interval is None and math.isfinite(m.calibration):
        judged = f"not judged: {clicks(m)} clicks (the click rate's interval at {cfg.noise_sds:g} sd reaches 0)"
        return GateCheck("calibration", True, m.calibration, list(cfg.calibration_range), judged)
    lo, hi = interval or (math.nan, math.nan)
    ok = interval is not None and hi >= low and lo <= high
    noise = (
        f" [{lo:.3f}, {hi:.3f}] at {cfg.noise_sds:g} sd of the click rate ({click_rate_sd(m):.4f} on "
        f"{m.rows} rows, {clicks(m)} clicks)"
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
        interval if cfg.noise_sds else None,
    )


def _min_auc(m: EvalMetrics, cfg: PublishConfig, *, first: bool) -> GateCheck:
    """The floor, for every model.  A first model (nothing to compare it with) whose AUC is within noise_sds
    Hanley-McNeil standard errors above the floor, or has none (fewer than 2 positives), is undecided."""
    auc = m.auc
    check = _check(
        "min_auc", auc >= cfg.min_auc, auc, cfg.min_auc, f"AUC {auc:.4f} is below publish.min_auc={cfg.min_auc}"
    )
    if not (first and check.passed and cfg.noise_sds):
        return check
    noise = cfg.noise_sds * float(hanley_mcneil_se(auc, clicks(m), m.rows - clicks(m)))
    if math.isfinite(noise) and auc - noise >= cfg.min_auc:
        return check
    near = f"within {cfg.noise_sds:g} standard errors ({noise:.4f}) of" if math.isfinite(noise) else "no error, near"
    interval = [auc - noise, auc + noise] if math.isfinite(noise) else None
    detail = f"min_auc: AUC {auc:.4f} on {_rows(m)}: {near} publish.min_auc={cfg.min_auc}"
    return GateCheck("min_auc", False, auc, cfg.min_auc, detail, interval, undecided=True)


def _leakage(m: EvalMetrics, cfg: PublishConfig) -> GateCheck:
    """Refused: an AUC >= LEAK_AUC with a logloss under LEAK_ENTROPY_SHARE of the click rate's entropy, unless
    publish.allow_leak.  Clicks are never that predictable; a label copied into a feature is."""
    p = m.click_rate
    entropy = -(p * math.log(p) + (1 - p) * math.log1p(-p)) if 0 < p < 1 else math.nan
    leak = m.auc >= LEAK_AUC and m.logloss <= LEAK_ENTROPY_SHARE * entropy
    return _check(
        "leakage",
        not leak or cfg.allow_leak,
        m.auc,
        LEAK_AUC,
        f"AUC {m.auc:.4f} with logloss {m.logloss:.4f} (the click rate alone scores {entropy:.4f}): no click model "
        "ranks this well, a feature most likely carries the label (docs/schema.md#leakage); publish.allow_leak=true "
        "publishes it",
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
    interval = [drop - noise, drop + noise] if noise else None
    if _outcome(drop, noise, cfg.max_gauc_drop) == "undecided":
        detail = (
            f"gauc: GAUC over {cfg.gauc_field} {mine:.4f}, {drop:+.4f} below the published model's, is within "
            f"{cfg.noise_sds:g} standard errors ({noise:.4f}), more than the {cfg.max_gauc_drop} allowed"
        )
        return GateCheck("gauc", False, mine, cfg.max_gauc_drop, detail, interval, undecided=True)
    return _check(
        "gauc",
        drop <= threshold,
        mine,
        threshold,
        f"GAUC over {cfg.gauc_field} {mine:.4f} is {drop:.4f} below the published model's {theirs:.4f} "
        f"(publish.max_gauc_drop={cfg.max_gauc_drop}{_noise_text(cfg, drop, noise)})",
        (drop - noise, drop + noise) if noise else None,
    )
