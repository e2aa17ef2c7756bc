"""The day's evaluation: what the gate compares, and what production saw, at a bounded cost.

    candidate + published model on all of the day's eval rows   -> the gate (exact: every row)
    published model on a seeded sample of the day's train rows  -> next-day AUC with its 95% interval
                                                                  (DeLong's, on the sample's rows)
    both on the pooled eval rows of earlier days, where the day's cannot decide  -> the gate (`flows.guards.pool`)

The published model is scored as served, its companion blended in.  A day whose rows lack what the companion
reads (its own keys `r_<j>`: a day of more rows than `encode.raw_keys_up_to`) does not score it at all
(`Evaluation.unserved`): its network alone is not what is served, and the gate never compares against it.

Both models are loaded once and scored in one pass over the eval rows on every core
(`trainer.eval.scoring_pass`).  Scored on every train row, the next-day AUC made evaluation grow with the
day as training does; it is a monitoring number, so a sample of bounded size whose interval is
recorded beside it serves it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from flows.guards.gate import GateDecision, Scores, comparisons, gate
from flows.guards.noise import clicks
from flows.guards.pool import Pooled, score_pool
from flows.guards.publish_config import PublishConfig
from storage.io import fsio
from trainer.eval.metrics import EvalMetrics

if TYPE_CHECKING:
    from trainer.eval.group_metrics import GroupAUC
    from trainer.eval.paired import Difference
    from trainer.eval.scoring import LoadedModel
    from trainer.eval.scoring_pass import Scored
    from trainer.plan.published import Published

Z95 = 1.959963984540054
"""The standard normal's 97.5% quantile."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EvaluateConfig:
    """The `evaluate` section: how the evaluate stage samples and scores."""

    next_day_rows: int = 100_000
    """Rows of the day's train split, drawn without replacement, on which the published model's
    next-day AUC is computed; 0 = all of them.  At AUC 0.77 and a 25% click rate 100,000 rows give a
    95% interval of about +-0.004; the interval is recorded with the AUC (metrics.json `evaluate`).
    The gate's comparison of the two models always uses every eval row."""
    seed: int = 0
    """Seed of the next-day sample, drawn with the date (numpy `default_rng([seed, YYYYMMDD])`): a
    rerun of a day scores the same rows, each day other ones."""
    batch_size: int = 2048
    """Rows per forward pass.  On CPU a few thousand score the most rows per CPU second: with larger
    batches the attention's activations leave the caches (an accelerator wants far more)."""
    threads: int = 0
    """Scoring threads, one torch thread each; 0 = one per core this process may use."""

    def __post_init__(self) -> None:
        if self.next_day_rows < 0:
            raise ValueError(f"evaluate.next_day_rows must be >= 0 (0 = all train rows), got {self.next_day_rows}")
        if self.batch_size < 1:
            raise ValueError(f"evaluate.batch_size must be >= 1, got {self.batch_size}")
        if self.threads < 0:
            raise ValueError(f"evaluate.threads must be >= 0 (0 = one per core), got {self.threads}")


@dataclass(frozen=True)
class NextDay:
    """The published model on a sample of the day's train rows, which it never saw: what production saw."""

    metrics: EvalMetrics
    auc_se: float
    """Standard error of the model's AUC on the day's traffic: DeLong's on the sample.  Not corrected for
    the finite population of the day's `of_rows` rows: those are themselves a sample of the traffic the
    number stands for, so a sample of every row still has its spread (the correction once gave
    `0.7434 [0.7434, 0.7434] on 3001 rows`, which claimed certainty no day of 3,001 rows has)."""
    of_rows: int
    seed: int

    @property
    def auc(self) -> float:
        return self.metrics.auc

    @property
    def ci95(self) -> tuple[float, float]:
        half = Z95 * self.auc_se
        return max(0.0, self.auc - half), min(1.0, self.auc + half)

    def record(self) -> dict[str, Any]:
        lo, hi = self.ci95
        return {
            "auc": self.auc,
            "auc_se": self.auc_se,
            "auc_ci95": [lo, hi],
            "rows": self.metrics.rows,
            "of_rows": self.of_rows,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Evaluation:
    new: EvalMetrics
    """The candidate on the day's eval rows."""
    published: EvalMetrics | None
    """The published model as served on the same rows (None before the first publish, or `unserved`)."""
    next_day: NextDay | None
    published_version: str | None
    rows_scored: int = 0
    """Rows scored, summed over the models."""
    seconds: float = 0.0
    threads: int = 1
    new_groups: dict[str, GroupAUC] = field(default_factory=dict)
    """Per field of `publish.group_fields()`: the candidate's AUC of each value (slices, GAUC)."""
    published_groups: dict[str, GroupAUC] = field(default_factory=dict)
    versus: Difference | None = None
    """The candidate minus the published model, row by row on the same eval rows, with the standard
    errors of the differences (the gate's noise level)."""
    versus_groups: dict[str, dict[Any, float]] = field(default_factory=dict)
    """Per field of `publish.group_fields()`: value -> the standard error of the two models' AUC
    difference on that value's eval rows, paired (the slice and GAUC checks' noise level)."""
    unserved: str = ""
    """Why the published model could not be scored as served on the day's rows (empty: it was, or there is none)."""
    pooled: Pooled | None = None
    """Both models on the pooled eval rows, where the day's could not decide a comparison (`flows.guards.pool`)."""

    @property
    def positives(self) -> int:
        """The day's eval positives (clicks)."""
        return clicks(self.new)

    def summary(self) -> str:
        pub = f"; published {self.published_version} AUC {self.published.auc:.4f}" if self.published else ""
        if self.unserved:
            pub += f"; published {self.published_version} not scored: {self.unserved}"
        if self.next_day:
            lo, hi = self.next_day.ci95
            pub += f", next-day {self.next_day.auc:.4f} [{lo:.4f}, {hi:.4f}] on {self.next_day.metrics.rows} rows"
        if self.pooled:
            pub += f"; {self.pooled.summary()}"
        return (
            f"evaluate: AUC {self.new.auc:.4f} logloss {self.new.logloss:.4f} on {self.new.rows} rows "
            f"({self.positives} positives){pub}; {self.rows_per_s:,.0f} rows/s"
        )

    @property
    def rows_per_s(self) -> float:
        return self.rows_scored / self.seconds if self.seconds > 0 else 0.0

    def record(self) -> dict[str, Any]:
        """The stage's scalar results for metrics.json: its rate beside the trainer's examples/s."""
        return {
            "rows_scored": self.rows_scored,
            "rows_per_s": self.rows_per_s,
            "seconds": self.seconds,
            "threads": self.threads,
            "next_day": self.next_day.record() if self.next_day else None,
            "versus_published": _finite(asdict(self.versus)) if self.versus else None,
            "positives": self.positives,
            "unserved": self.unserved,
            "pooled": _finite(self.pooled.record()) if self.pooled else None,
        }


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """NaN (an undefined standard error) as None: metrics.json stays strict JSON."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}


def evaluate_day(
    cfg: EvaluateConfig,
    *,
    date: str,
    features_url: str,
    candidate_url: str,
    published: Published | None,
    storage_options: dict | None = None,
    groups: dict[str, str] | None = None,
    publish: PublishConfig | None = None,
    pool: Mapping[str, str] | None = None,
) -> Evaluation:
    """The candidate and the published model on the day's eval rows, and the published model's next-day AUC;
    with `publish` and `pool`, both on the pooled rows too where the day's cannot decide a comparison.

    Args:
        features_url: the day's committed features (its files: `train/` and `eval/`).
        candidate_url: the day's trained model directory.
        published: the model published when the run took the slot (None before the first publish).
        groups: key column (`k_3`) -> field name (`C4`) of the fields whose per-value AUC the gate
            checks (`publish.group_fields()`), on the eval rows, for both models.
        pool: date -> eval rows of the earlier dates whose rows neither model trained on, newest first
            (`flows.guards.pool.unseen_dates`); the day's own rows join them when both models score them.
    """
    # here, not at the top: `flows.config` imports this module, and every CLI command loads the config
    from trainer.eval.scoring import load_model
    from trainer.eval.scoring_pass import evaluate_together, feature_columns, read_split
    from trainer.threads import core_count

    t0 = time.perf_counter()
    threads = cfg.threads or core_count()
    eval_url = fsio.join(features_url, "eval")
    models = [load_model(candidate_url, storage_options)]
    if published:
        models.append(load_model(published.url, storage_options))
    unserved = _unserved(models[1:], eval_url, storage_options)
    day = models[:1] if unserved else models
    groups = groups or {}
    on_eval = evaluate_together(
        day,
        read_split(eval_url, feature_columns(day), storage_options),
        batch_size=cfg.batch_size,
        threads=threads,
        groups=tuple(groups),
        paired=len(day) > 1,
    )
    by_field = [{groups[c]: g for c, g in scored.groups.items()} for scored in on_eval]
    new = EvalMetrics.of(on_eval[0].result())
    scored = new.rows * len(day)
    if not published:
        return Evaluation(new, None, None, None, scored, time.perf_counter() - t0, threads, by_field[0])
    next_day, sampled = (
        (None, 0)
        if unserved
        else _next_day(
            cfg, models[1], date=date, features_url=features_url, threads=threads, storage_options=storage_options
        )
    )
    ev = Evaluation(
        new,
        None if unserved else EvalMetrics.of(on_eval[1].result()),
        next_day,
        published.version,
        scored + sampled,
        0.0,
        threads,
        by_field[0],
        {} if unserved else by_field[1],
        None if unserved else on_eval[1].versus_first,
        {} if unserved else _paired_groups(on_eval[1], groups),
        unserved,
    )
    if publish is not None and pool and _undecided(ev, publish, published):  # earlier rows can add evidence
        urls = {**({} if unserved else {date: eval_url}), **pool}
        pooled = score_pool(
            models, urls, batch_size=cfg.batch_size, threads=threads, groups=groups, storage_options=storage_options
        )
        ev = replace(ev, pooled=pooled, rows_scored=ev.rows_scored + (pooled.new.rows * 2 if pooled else 0))
    return replace(ev, seconds=time.perf_counter() - t0)


def gate_day(ev: Evaluation, cfg: PublishConfig, *, date: str, published_through: str | None) -> GateDecision:
    """The publish gate on the evaluation: the absolute checks on the day's eval rows, the comparisons on the
    pooled rows where the day's could not decide them (`Evaluation.pooled`), else on the day's; the evidence
    names the dates compared on."""
    new = Scores(ev.new, ev.new_groups, trained_through=date)
    if ev.published_version is None:
        return gate(new, None, cfg)
    p = ev.pooled
    if p is not None:
        decision = gate(
            new,
            Scores(p.published, p.published_groups, trained_through=published_through),
            cfg,
            versus=p.versus,
            versus_groups=p.versus_groups,
            compared=Scores(p.new, p.new_groups, trained_through=date),
        )
        return replace(decision, evidence={**decision.evidence, "dates": list(p.dates)})
    old = (
        Scores(ev.published, ev.published_groups, trained_through=published_through)
        if ev.published is not None
        else Scores.not_served(ev.unserved, published_through)
    )
    decision = gate(new, old, cfg, versus=ev.versus, versus_groups=ev.versus_groups)
    return replace(decision, evidence={**decision.evidence, "dates": [] if ev.unserved else [date]})


def _unserved(published: list[LoadedModel], eval_url: str, storage_options: dict | None) -> str:
    """Why the published model (the list's one, if any) cannot be scored as served on the rows at `eval_url`."""
    from trainer.eval.scoring_pass import has_own_keys

    if not published or published[0].companion is None or has_own_keys(eval_url, storage_options):
        return ""
    return (
        "its companion reads the values' own keys r_<j>, which a day of more rows than encode.raw_keys_up_to "
        "lacks (encode.raw_keys=true writes them every day)"
    )


def _paired_groups(scored: Scored, groups: dict[str, str]) -> dict[str, dict[Any, float]]:
    """Per gated field: value -> the paired standard error of the two models' AUC difference on its rows."""
    return {
        groups[c]: {v.item(): float(e) for v, e in zip(scored.groups[c].values, se, strict=True)}
        for c, se in scored.group_se_versus_first.items()
    }


def _undecided(ev: Evaluation, cfg: PublishConfig, published: Published) -> bool:
    """Whether the day's rows leave a comparison of the gate undecided and none refused: wider evidence helps."""
    old = (
        Scores(ev.published, ev.published_groups)
        if ev.published is not None
        else Scores.not_served(ev.unserved, published.meta.vocab_date)
    )
    checks = comparisons(Scores(ev.new, ev.new_groups), old, cfg, versus=ev.versus, versus_groups=ev.versus_groups)
    return any(c.undecided for c in checks) and all(c.passed or c.undecided for c in checks)


def _next_day(
    cfg: EvaluateConfig,
    published: LoadedModel,
    *,
    date: str,
    features_url: str,
    threads: int,
    storage_options: dict | None,
) -> tuple[NextDay, int]:
    """The published model's AUC on a seeded sample of the day's train rows (a day it has not trained on), with
    DeLong's interval; (that, the rows sampled)."""
    from trainer.eval.scoring_pass import evaluate_together, feature_columns, sample_rows

    sample = sample_rows(
        fsio.join(features_url, "train"),
        feature_columns([published]),
        cfg.next_day_rows,
        seed=[cfg.seed, int(date.replace("-", ""))],
        storage_options=storage_options,
    )
    (seen,) = evaluate_together([published], [sample.frame], batch_size=cfg.batch_size, threads=threads)
    try:
        se = seen.auc.standard_error()
    except ValueError:  # a sample with a single positive or negative: AUC defined, its spread not
        se = float("nan")
    return NextDay(EvalMetrics.of(seen.result()), se, sample.of_rows, cfg.seed), sample.rows
