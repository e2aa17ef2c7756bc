"""The companion's file (`trainer.companion.file`): a bad or missing one is refused."""

from __future__ import annotations

import pytest

from trainer.companion.file import from_bytes, load


def test_a_bad_or_missing_file_is_refused_saying_retrain(tmp_path):
    with pytest.raises(FileNotFoundError, match="names a companion; retrain"):
        load(str(tmp_path / "missing.safetensors"), blend_weight=0.5)
    with pytest.raises(ValueError, match="x.safetensors is not a companion file.*retrain"):
        from_bytes(b"not safetensors", "x.safetensors", blend_weight=0.5)
