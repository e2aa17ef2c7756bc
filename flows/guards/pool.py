"""The gate's wider evidence: both models, as served, on the pooled eval rows of the last days neither trained on.

Where the day's eval rows cannot decide a comparison (too few positives for publish.max_auc_drop, or rows the
published model cannot be scored on as served), the evaluate stage scores the candidate and the published model
on the eval rows of the last `publish.pool_days` dates, this one included, that neither model trained on, in
one pass with their paired difference (`trainer.eval.scoring_pass`), and the gate compares them there.

Which rows neither model trained on: a day's own eval rows are never trained on that day, but the next day
trains on its parent's eval rows first (`trainer.plan.parent_eval`, the record's `train.parent_eval.date`), and
every model descends from published days' models only.  So a date's eval rows are pooled when no run in the
window (today's included) carried them and its day completed (published or refused: a day a check stopped is
not trusted); today's always.  That keeps the published model's own day (never trained on by it) when the
candidate did not carry it, and every refused day since.  A date whose eval rows lack a column either model
reads as served (a companion's own keys `r_<j>`, on a day of more rows than `encode.raw_keys_up_to`) is left
out, and said so.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from flows.guards.noise import clicks
from storage.io import fsio
from trainer.eval.metrics import EvalMetrics

if TYPE_CHECKING:  # `flows.config` imports the evaluation, which imports this: no torch at import
    from trainer.eval.group_metrics import GroupAUC
    from trainer.eval.paired import Difference
    from trainer.eval.scoring import LoadedModel

POOLED_STATUSES = ("published", "refused")
"""The statuses of an earlier day whose eval rows may be pooled (`flows.day.record.Status`)."""


@dataclass(frozen=True)
class PastDay:
    """What pooling needs of an earlier day's record."""

    date: str
    status: str
    carried: str | None
    """The date whose eval rows the day's run trained on first (its `train.parent_eval.date`)."""


def unseen_dates(date: str, before: Sequence[PastDay], carried: str | None) -> list[str]:
    """`date` and the dates of `before` whose eval rows neither model trained on (the module docstring), newest
    first.  `carried`: the date whose eval rows today's candidate trained on first."""
    trained = {d.carried for d in before if d.carried} | ({carried} if carried else set())
    kept = [d.date for d in sorted(before, key=lambda d: d.date, reverse=True) if d.status in POOLED_STATUSES]
    return [d for d in [date, *kept] if d not in trained]


@dataclass(frozen=True)
class Pooled:
    """Both models as served on the pooled eval rows."""

    dates: tuple[str, ...]
    """The dates whose eval rows were pooled, newest first."""
    new: EvalMetrics
    published: EvalMetrics
    versus: Difference | None
    new_groups: dict[str, GroupAUC] = field(default_factory=dict)
    published_groups: dict[str, GroupAUC] = field(default_factory=dict)
    versus_groups: dict[str, dict[Any, float]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    """Dates that could not be pooled -> why."""

    @property
    def positives(self) -> int:
        return clicks(self.new)

    def summary(self) -> str:
        se = f", paired se {self.versus.auc_se:.4f}" if self.versus else ""
        out = f"; left out {', '.join(f'{d} ({w})' for d, w in self.left_out.items())}" if self.left_out else ""
        return (
            f"pooled {', '.join(self.dates)}: {self.new.rows} rows ({self.positives} positives), AUC "
            f"{self.new.auc:.4f} vs published {self.published.auc:.4f}{se}{out}"
        )

    def record(self) -> dict[str, Any]:
        v = self.versus
        return {
            "dates": list(self.dates),
            "rows": self.new.rows,
            "positives": self.positives,
            "auc": self.new.auc,
            "published_auc": self.published.auc,
            "auc_se": v.auc_se if v else None,
            "left_out": dict(self.left_out),
        }


def poolable(
    eval_urls: Mapping[str, str], columns: Sequence[str], storage_options: dict | None
) -> tuple[list[str], dict[str, str]]:
    """The dates of `eval_urls` (date -> eval rows, in order) whose rows hold `columns`, and why each other is not."""
    kept, left_out = [], {}
    for date, url in eval_urls.items():
        names = _columns(url, storage_options)
        lacking = [c for c in columns if names is not None and c not in names]
        if names is None:
            left_out[date] = "no eval rows"
        elif lacking:
            left_out[date] = f"no {', '.join(lacking[:3])}{'...' if len(lacking) > 3 else ''}"
        else:
            kept.append(date)
    return kept, left_out


def score_pool(
    models: Sequence[LoadedModel],
    eval_urls: Mapping[str, str],
    *,
    batch_size: int,
    threads: int,
    groups: Mapping[str, str],
    storage_options: dict | None,
) -> Pooled | None:
    """The candidate (`models[0]`) and the published model (`models[1]`) on the pooled rows of `eval_urls`
    (date -> eval rows, newest first); None when no date holds what both read."""
    from trainer.eval.scoring_pass import evaluate_together, feature_columns, read_split

    columns = feature_columns(models)
    dates, left_out = poolable(eval_urls, columns, storage_options)
    if not dates:
        return None
    frames: Iterator[Any] = itertools.chain.from_iterable(
        read_split(eval_urls[d], columns, storage_options) for d in dates
    )
    new, old = evaluate_together(
        models, frames, batch_size=batch_size, threads=threads, groups=tuple(groups), paired=True
    )
    return Pooled(
        tuple(dates),
        EvalMetrics.of(new.result()),
        EvalMetrics.of(old.result()),
        old.versus_first,
        {groups[c]: g for c, g in new.groups.items()},
        {groups[c]: g for c, g in old.groups.items()},
        {
            groups[c]: {v.item(): float(e) for v, e in zip(old.groups[c].values, se, strict=True)}
            for c, se in old.group_se_versus_first.items()
        },
        left_out,
    )


def _columns(url: str, storage_options: dict | None) -> set[str] | None:
    """The columns of the Parquet parts under `url` (one encode writes a day's parts alike); None without any."""
    from trainer.data import list_parts

    try:
        first = list_parts(url, storage_options)[0]
    except FileNotFoundError:
        return None
    fs, _ = fsio.get_fs(url, storage_options)
    with fs.open(first, "rb") as fh:
        return set(pq.ParquetFile(fh).schema_arrow.names)
