"""The rows a day trains on before its own: the eval rows of the model it starts from.

A day's last `encode.eval_fraction` of rows is held out from its training for its gate
(`flows.guards.gate`).  Once that model is published the gate has used them, and they are its day's latest
rows, the closest to what the next model will serve.  So the next day trains on them first, in every
epoch (`optim.train_parent_eval`), with the keys today's vocabulary evicted read as OOV
(`trainer.data.Source`).  Today's own eval rows stay out of training, so today's gate still scores
rows no model it compares has trained on.

On the quality samples this is what `bench.quality_ladder` row 6 adds to row 5
(`docs/reports/2026-12-01-daily-recipe.md`).

Nothing is carried, and the record says why, when there is no published model, the option is off,
the published model's day is not before this one (a rerun of an older date), or that day's features
are gone, hold no eval rows, or have other columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from storage.features_manifest import read_features_manifest
from storage.io import fsio
from trainer.data import read_schema
from trainer.launch.spec import CarriedRows
from trainer.plan.published import Published


@dataclass(frozen=True)
class ParentEval:
    """What the day carries (None: nothing) and why."""

    carried: CarriedRows | None
    reason: str

    @property
    def rows(self) -> int:
        return self.carried.rows if self.carried else 0

    def summary(self) -> str:
        """What the train stage's line appends to how the run starts ("from v00003")."""
        if self.carried is None:
            return f", its eval rows not trained ({self.reason})"
        return f" + its {self.carried.rows:,} eval rows"

    def record(self) -> dict[str, Any]:
        c = self.carried
        return {"date": c.date if c else None, "rows": self.rows, "reason": self.reason}


def parent_eval(
    *,
    enabled: bool,
    date: str,
    features_url: str,
    published: Published | None,
    evicted_url: str | None,
    storage_options: dict[str, Any] | None,
) -> ParentEval:
    """The eval rows of `published`'s day to train before the day `date` (features at `features_url`)."""
    if not enabled:
        return ParentEval(None, "optim.train_parent_eval is false")
    if published is None:
        return ParentEval(None, "no published model")
    url = published.meta.features_url
    fs, path = fsio.get_fs(url, storage_options)
    manifest = read_features_manifest(fs, path)
    if manifest is None:
        return ParentEval(None, f"the features {published.version} trained on are gone ({url})")
    theirs = manifest.date or ""
    if not theirs or theirs >= date:
        return ParentEval(None, f"{published.version} trained on {theirs or 'an unknown day'}, not before {date}")
    rows = sum(p.rows for p in manifest.eval_part_rows)
    if rows == 0:
        return ParentEval(None, f"the features of {theirs} hold no eval rows")
    if read_schema(url, storage_options) != read_schema(features_url, storage_options):
        return ParentEval(None, f"the features of {theirs} have other columns than {date}'s")
    carried = CarriedRows(
        features_url=url, features_id=manifest.run_id, date=theirs, rows=rows, evicted_url=evicted_url
    )
    return ParentEval(carried, f"{published.version}'s eval rows, used by its gate")
