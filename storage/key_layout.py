"""The layout of a feature key, shared by the pipeline that makes keys and the trainer that reads them.

key = field << FIELD_SHIFT | h: the field index in the top bits, a 56-bit value hash below, where
h = OOV_HASH is the field's out-of-vocabulary key and h = MISSING_HASH its missing-value key
(`pipeline.encode.keys` computes h).  Here so that a rank (`trainer.data`) can read a key without
importing the ingest package.
"""

from __future__ import annotations

import numpy as np

FIELD_SHIFT = 56
HASH_MASK = (1 << FIELD_SHIFT) - 1
MAX_FIELDS = 128
OOV_HASH = 0
MISSING_HASH = 1


def to_oov(keys: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """`keys` (any shape) with each key in `dropped` (sorted int64) replaced by its field's OOV key.

    Rows encoded with an older vocabulary then read as today's encoding gives them: a key the
    vocabulary has evicted since is out of vocabulary now (`trainer.data.Source`).
    """
    keys = np.asarray(keys, dtype=np.int64)
    if dropped.size == 0 or keys.size == 0:
        return keys
    at = np.minimum(np.searchsorted(dropped, keys), dropped.size - 1)
    hit = dropped[at] == keys
    if not hit.any():
        return keys
    return np.where(hit, np.left_shift(np.right_shift(keys, FIELD_SHIFT), FIELD_SHIFT) | OOV_HASH, keys)
