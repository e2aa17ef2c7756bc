"""The results of a day's stages after the data stages: checks, warm, train and publish.

Each is frozen; its `summary()` is the one line the run logs and its `record()` (where it has one) what
metrics.json keeps of it.  The stages (`flows.day.stages`) build them, `flows.day.state.DayState` carries
them to the stages after; the data stages' results are their packages' (`IngestResult`, `VocabResult`,
`EncodeResult`), the evaluate stage's `flows.guards.evaluation.Evaluation`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flows.guards.data_checks import CheckReport
from storage.embedding.ssd.upgrade import cost
from storage.warm import WarmPlan
from trainer.launch.torchrun import TrainResult
from trainer.plan.parent_eval import ParentEval
from trainer.plan.recipe import Recipe


@dataclass(frozen=True)
class ChecksOutcome:
    report: CheckReport
    stats: dict[str, Any]
    """The day's checked series (kept in its record for the days after it)."""
    chart_url: str

    def summary(self) -> str:
        r = self.report
        bad = "; ".join(f"{c.name} {c.status.upper()}: {c.detail}" for c in (*r.failed, *r.warned))
        return (
            f"checks: {len(r.results)} run against {len(r.window)} day(s), {len(r.failed)} failed, "
            f"{len(r.warned)} warned" + (f"; {bad}" if bad else "") + (f" ({r.note})" if r.note else "")
        )


@dataclass(frozen=True)
class WarmResult:
    plan: WarmPlan
    """The plan the train spec carries: ranks on other nodes warm their own shards from it."""
    warmed_by: str
    """`flow` (this node's shards, here) or `ranks` (several nodes: each rank warms its own)."""
    warm_start: str
    """How the run starts: from the published model, or cold (and why)."""
    rows: int = 0
    shards_restored: int = 0
    rebuilt: Mapping[str, Any] = field(default_factory=dict)
    """What rebuilding the shards cost: `restored_rows` and `restore_s` (from the published snapshot), and
    `converted_shards` (each `{"from", "rows", "s"}`: records of another format or row format converted where they
    lie, `storage.embedding.ssd.upgrade`)."""
    seconds: float = 0.0
    row_format: str = ""
    """The day's rows, `optimizer/row_dtype` (`storage.embedding.rows.format.RowFormat.name`)."""
    converted_from: str | None = None
    """The published rows' format when it differs: the warm converts them (`RowFormat.convert`)."""
    config_sources: Mapping[str, str] = field(default_factory=dict)
    """Where each shape key's value came from: `set`, `lineage` or `default` (`flows.config.config_sources`)."""

    def summary(self) -> str:
        conv = f"; rows converted from {self.converted_from} to {self.row_format}" if self.converted_from else ""
        if self.warmed_by == "ranks":
            return f"warm: left to the ranks of {self.plan.world_size} (several nodes); {self.warm_start}{conv}"
        return (
            f"warm: {self.plan.world_size} shard(s), {self.rows} rows, {self.shards_restored} restored"
            f"{self._rebuilt()}; {self.warm_start}{conv}"
        )

    def _rebuilt(self) -> str:
        """The cost of the shards' rebuilds, each with its rate per 10^8 rows."""
        rows, took = self.rebuilt.get("restored_rows", 0), self.rebuilt.get("restore_s", 0.0)
        text = f" ({cost(rows, took)})" if rows else ""
        for c in self.rebuilt.get("converted_shards", ()):
            text += f", 1 converted where it lies from {c['from']} ({cost(c['rows'], c['s'])})"
        return text

    def record(self) -> dict[str, Any]:
        return {
            "warmed_by": self.warmed_by,
            "rows": self.rows,
            "shards_restored": self.shards_restored,
            "published_version": self.plan.published_version,
            "token": self.plan.token,
            "warm_start": self.warm_start,
            "row_format": self.row_format,
            "converted_from": self.converted_from,
            "rebuilt": dict(self.rebuilt),
            "config_sources": dict(self.config_sources),
        }


@dataclass(frozen=True)
class TrainOutcome:
    result: TrainResult
    parent_version: str | None
    """The model published when the run started (None before the first publish); `warm_start`
    says whether its weights were used."""
    warm_start: str
    run_tag: str
    recipe: Recipe
    """The optim values for the day's size (`trainer.plan.recipe`)."""
    parent_eval: ParentEval
    """The eval rows of the parent's day trained before the day's own, or why none (`trainer.plan.parent_eval`)."""

    def summary(self) -> str:
        carried = self.parent_eval.summary() if self.parent_version else ""  # nothing to say before a first model
        c = self.result.meta.companion
        second = f"; companion: {c['rows']:,} rows, C {c['C']:g}, {c['fit_s']:.1f} s" if c else ""
        return f"{self.result.summary()}; {self.warm_start}{carried}; {self.recipe.summary()}{second}"

    def record(self) -> dict[str, Any]:
        r, t = self.result, self.result.train
        return {
            "steps": t.steps,
            "examples": t.examples,
            "sampled_out": t.sampled_out,
            "final_loss": t.final_loss,
            "mean_loss": t.mean_loss,
            "examples_per_s": t.examples_per_s,
            "world_size": t.world_size,
            "wall_s": r.wall_s,
            "backend": t.backend,
            "device": t.device,
            "attention_kernel": t.attention_kernel,
            "model_url": r.model_url,
            "parent_version": self.parent_version,
            "warm_start": self.warm_start,
            "run_tag": self.run_tag,
            "recipe": self.recipe.record(),
            "parent_eval": self.parent_eval.record(),
            "companion": r.meta.companion,
            "store": p.record() if (p := t.store_pressure()) else None,
        }


@dataclass(frozen=True)
class PublishResult:
    published: bool
    version: str
    reason: str
    latest: str | None
    """The version `LATEST` names after the stage."""
    checks: list[dict[str, Any]] = field(default_factory=list)
    """The gate's checks with their values (`flows.guards.gate.GateDecision.values`)."""
    bundles: dict[str, Any] | None = None
    """What `flows.serving.export.write_bundles` wrote (bytes of the full bundle and of the delta)."""
    pruned: str = ""
    """The retention summary (`ModelRegistry.prune`)."""
    verdict: str = "passed"
    """The gate's verdict: `passed`, `refused` or `undecided: <why>` (`flows.guards.gate.GateDecision.verdict`)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """What the gate's comparisons read: rows, positives, auc_se, dates (`GateDecision.evidence`)."""

    def summary(self) -> str:
        if self.published:
            return f"publish: {self.version} is now LATEST ({self.reason}); {self.pruned}"
        refused = "UNDECIDED" if self.verdict.startswith("undecided") else "REFUSED"
        return f"publish: {refused} {self.version}: {self.reason}; LATEST stays {self.latest or 'unset'}"
