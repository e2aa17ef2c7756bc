"""Tiny day counts for the vocabulary rule tests: field-0 values named by keyword."""

from __future__ import annotations

import pandas as pd

from pipeline.encode.keys import feature_keys
from pipeline.vocab.counts import count_keys


def counts(**key_count: int) -> pd.DataFrame:
    """Day counts of field-0 values named by the keyword, e.g. counts(a=2, b=1)."""
    frame = pd.DataFrame({"v": [k for k, n in key_count.items() for _ in range(n)]})
    return count_keys(frame, ["v"])


def key(value: str, field: int = 0) -> int:
    """The key of `value` in field `field`."""
    return int(feature_keys(field, [value])[0])
