"""Names a model's things on a shared Prefect server carry: the model and its root, and the config it ran.

One Prefect server may hold the same model name for several roots (staging and prod): artifacts,
automations and the tags the automations match are keyed by `model_key` (`ctr-3fa9c1d2`: the model's
name and a short digest of its root, as the slot's limit is: `flows.prefect.slot`), so the second
root's artifacts and alerts never mix with the first's.  `config_digest` names the config a run used:
deployments freeze the config into their parameters at deploy time, and every run logs the digest
(and its artifact shows it), so a run that did not pick up an edited file is seen at once.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from storage.io.layout import Layout, root_digest

ROOT_DIGITS = 8
"""Hex digits of the root's digest in `model_key`: short enough to read, enough for a server's roots."""
MODEL_TAG = "model"
"""`model:<name>`: a person's filter in the UI (all roots of the model)."""
KEY_TAG = "ctr-model"
"""`ctr-model:<model_key>`: what the model's automations match (one root)."""


def model_key(layout: Layout) -> str:
    """`<model>-<8 hex digits of the root>`: the model on its root, e.g. `ctr-3fa9c1d2`."""
    return f"{layout.model_name}-{root_digest(layout.root)[:ROOT_DIGITS]}"


def run_tags(layout: Layout) -> list[str]:
    """The tags of the model's flow runs and deployments: `model:<name>` and `ctr-model:<model_key>`."""
    return [f"{MODEL_TAG}:{layout.model_name}", f"{KEY_TAG}:{model_key(layout)}"]


def config_digest(config: dict[str, Any]) -> str:
    """12 hex digits naming a run's config (`RunConfig.to_dict()`): equal digests, equal configs."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]
