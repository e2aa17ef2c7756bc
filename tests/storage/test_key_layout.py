"""storage.key_layout: the key's field bits, and evicted keys read as their field's OOV key."""

from __future__ import annotations

import numpy as np

from pipeline.encode.keys import feature_keys, missing_key, oov_key
from storage.key_layout import FIELD_SHIFT, to_oov


def test_evicted_keys_become_their_fields_oov_key_and_the_rest_are_kept():
    keys = feature_keys(3, ["a", "b", "c", None]).reshape(2, 2)
    dropped = np.sort(feature_keys(3, ["b", "zz"]))
    out = to_oov(keys, dropped)
    assert out.shape == (2, 2) and out.tolist() == [[keys[0, 0], oov_key(3)], [keys[1, 0], missing_key(3)]]
    assert oov_key(3) == 3 << FIELD_SHIFT
    assert to_oov(keys, np.empty(0, np.int64)) is keys and to_oov(keys[:0], dropped).size == 0
