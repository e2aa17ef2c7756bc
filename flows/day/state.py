"""What a daily run knows so far: `DayState`, handed from stage to stage.

Every stage takes the run config and the state and returns its own frozen result; the runner
(`flows.day.run.run_day`) puts that result into a new state for the next stage.  What a run reads from
storage is read once and carried here: the published model (`LATEST` and its model.json) is read
when the run takes the model's slot, the committed directories' data URLs come with the data
stages' results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from storage.io.layout import Layout
from storage.io.registry import ModelRegistry
from trainer.model_dir import read_meta
from trainer.plan.published import Published

if TYPE_CHECKING:  # results of the stages; only their types are needed here
    from flows.day.results import ChecksOutcome, PublishResult, TrainOutcome, WarmResult
    from flows.guards.evaluation import Evaluation
    from pipeline.encode.stage import EncodeResult
    from pipeline.ingest.stage import IngestResult
    from pipeline.vocab.stage import VocabResult


def read_published(layout: Layout, *, date: str | None = None) -> Published | None:
    """The model `LATEST` names, with its model.json, or None before the first publish.

    With `date`: the model published before `date`'s run.  When `LATEST` names a version trained on
    `date` itself, a run of that date published it and was stopped before it recorded the day; its
    rerun must start from the same parent as that run did, so that it gets the same run tag and
    finds its candidate and its version again (`flows.day.stages.train`, `flows.day.stages.publish`).
    """
    registry = ModelRegistry(layout)
    version = registry.latest()
    if version is not None and date is not None:
        lineage = registry.lineage(version)
        if lineage.date == date:
            version = lineage.parent_version
    if version is None:
        return None
    url = registry.url(version)
    return Published(version=version, url=url, meta=read_meta(url, layout.storage_options))


RESULTS = ("ingest", "vocab", "encode", "checks", "warm", "train", "evaluation", "publish")
"""The stage results a `DayState` carries, in run order (`flows.day.run.Stage.result_field`)."""


@dataclass(frozen=True)
class DayState:
    """One date's run: the results of the stages done so far.

    Each result has a typed accessor (`state.encode -> EncodeResult`, ...) that raises a
    `RuntimeError` naming the stage when it has not run, so a stage called out of order fails
    with that message rather than an `AttributeError` on None further down.  The runner adds
    results with `with_result`; tests build a state the same way.
    """

    date: str
    layout: Layout
    force: bool = False
    """Recompute committed stages (`--force`)."""
    published: Published | None = None
    """Read once, inside the model's slot (before warm): the model published before this date's run."""
    results: Mapping[str, Any] = field(default_factory=dict)
    """Stage name (one of `RESULTS`) -> its result; read through the typed accessors below."""

    def with_result(self, name: str, result: Any) -> DayState:
        """This state with stage `name`'s result added (the runner calls it after each stage).

        Raises:
            ValueError: `name` is not one of `RESULTS`.
        """
        if name not in RESULTS:
            raise ValueError(f"no stage result named {name!r}; a DayState carries {', '.join(RESULTS)}")
        return replace(self, results={**self.results, name: result})

    def _result(self, name: str) -> Any:
        value = self.results.get(name)
        if value is None:
            raise RuntimeError(f"the {name} stage of {self.date} has not run; run_day runs the stages in order")
        return value

    @property
    def ingest(self) -> IngestResult:
        return cast("IngestResult", self._result("ingest"))

    @property
    def vocab(self) -> VocabResult:
        return cast("VocabResult", self._result("vocab"))

    @property
    def encode(self) -> EncodeResult:
        return cast("EncodeResult", self._result("encode"))

    @property
    def checks(self) -> ChecksOutcome:
        return cast("ChecksOutcome", self._result("checks"))

    @property
    def warm(self) -> WarmResult:
        return cast("WarmResult", self._result("warm"))

    @property
    def train(self) -> TrainOutcome:
        return cast("TrainOutcome", self._result("train"))

    @property
    def evaluation(self) -> Evaluation:
        return cast("Evaluation", self._result("evaluation"))

    @property
    def publish(self) -> PublishResult:
        return cast("PublishResult", self._result("publish"))
