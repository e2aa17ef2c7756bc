"""The old-format sample files of `tests/data/formats/` (see its README), and the edits every reader must survive."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1] / "data" / "formats"


def sample(name: str) -> dict[str, Any]:
    """The content of `tests/data/formats/<name>` (a fresh copy each call)."""
    return json.loads((DATA / name).read_text())


def newer(data: dict[str, Any], **sections: str) -> dict[str, Any]:
    """`data` as a later release might write it: an unknown top-level field, and in each named section
    (`section="key"`) a key this code does not know (a retired key reads the same)."""
    out = copy.deepcopy(data)
    out["field_of_a_later_release"] = {"nested": [1, 2]}
    for section, key in sections.items():
        out[section] = {**out.get(section, {}), key: "retired value"}
    return out
