"""The model a day starts from: the version `LATEST` named when the run took the model's slot.

The flow reads it once (`flows.day.state.read_published`); the training decisions of `trainer.plan` and
the warm and evaluate stages take it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.model_dir import ModelMeta


@dataclass(frozen=True)
class Published:
    """The published model when the run took the model's slot."""

    version: str
    url: str
    """Its files (a committed directory: an object store's data prefix)."""
    meta: ModelMeta
