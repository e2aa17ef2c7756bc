"""What a daily run knows so far: `DayState`, handed from stage to stage.

Every stage takes the run config and the state and returns its own frozen result; the runner
(`flows.day.run_day`) puts that result into a new state for the next stage.  What a run reads from
storage is read once and carried here: the published model (`LATEST` and its model.json) is read
when the run takes the model's slot, the committed directories' data URLs come with the data
stages' results.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from storage.io.layout import Layout
from storage.io.registry import ModelRegistry
from trainer.model_dir import ModelMeta, read_meta

if TYPE_CHECKING:  # results of the stages (flows.stages); only their types are needed here
    from flows.stages import (
        ChecksOutcome,
        Evaluation,
        PublishResult,
        TrainOutcome,
        WarmResult,
    )
    from pipeline.encode import EncodeResult
    from pipeline.ingest_stage import IngestResult
    from pipeline.vocab_stage import VocabResult


@dataclass(frozen=True)
class Published:
    """The published model when the run took the model's slot."""

    version: str
    url: str
    """Its files (a committed directory: an object store's data prefix)."""
    meta: ModelMeta


def read_published(layout: Layout, *, date: str | None = None) -> Published | None:
    """The model `LATEST` names, with its model.json, or None before the first publish.

    With `date`: the model published before `date`'s run.  When `LATEST` names a version trained on
    `date` itself, a run of that date published it and was stopped before it recorded the day; its
    rerun must start from the same parent as that run did, so that it gets the same run tag and
    finds its candidate and its version again (`flows.stages.train`, `flows.stages.publish`).
    """
    registry = ModelRegistry(layout)
    version = registry.latest()
    if version is not None and date is not None:
        lineage = registry.read_json(version, "lineage.json")
        if lineage["date"] == date:
            version = lineage["parent_version"]
    if version is None:
        return None
    url = registry.url(version)
    return Published(version=version, url=url, meta=read_meta(url, layout.storage_options))


@dataclass(frozen=True)
class DayState:
    """One date's run: the results of the stages done so far (None: not run yet)."""

    date: str
    layout: Layout
    force: bool = False
    """Recompute committed stages (`--force`)."""
    published: Published | None = None
    """Read once, inside the model's slot (before warm): the model published before this date's run."""
    ingest: IngestResult | None = None
    vocab: VocabResult | None = None
    encode: EncodeResult | None = None
    checks: ChecksOutcome | None = None
    warm: WarmResult | None = None
    train: TrainOutcome | None = None
    evaluation: Evaluation | None = None
    publish: PublishResult | None = None

    def need(self, name: str) -> Any:
        """The result of stage `name`; raises when a stage is run before the ones it needs."""
        value = getattr(self, name)
        if value is None:
            raise RuntimeError(f"the {name} stage of {self.date} has not run; run_day runs the stages in order")
        return value

    def with_result(self, name: str, result: Any) -> DayState:
        return replace(self, **{name: result})
