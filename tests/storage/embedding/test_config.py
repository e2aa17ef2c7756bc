"""StoreConfig: bad values are refused on construction, naming the field and the value."""

from __future__ import annotations

import pytest

from storage.embedding.config import StoreConfig


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"embedding_dim": 0}, "store.embedding_dim must be >= 1, got 0"),
        ({"init_std": 0.0}, "store.init_std must be > 0, got 0.0"),
        ({"host_budget_mb": -1}, "store.host_budget_mb must be >= 1, got -1"),
        ({"device_cache_rows": -7}, "store.device_cache_rows must be 'auto' or an integer >= 0, got -7"),
        ({"device_cache_rows": "most"}, "store.device_cache_rows must be 'auto' or an integer >= 0, got 'most'"),
        ({"cache_policy": "fifo"}, "store.cache_policy must be one of .*'fifo'"),
        ({"local_dir": "s3://bucket/x"}, "must be a local directory"),
    ],
)
def test_bad_values_are_refused_naming_the_field(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        StoreConfig(**kw)


def test_a_file_url_is_a_local_directory() -> None:
    assert StoreConfig(local_dir="file:///tmp/x").local_dir == "file:///tmp/x"


def test_the_device_cache_is_auto_by_default_and_a_number_given_as_text_is_read() -> None:
    assert StoreConfig().device_cache_rows == "auto"
    assert StoreConfig(device_cache_rows="4096").device_cache_rows == 4096  # as the YAML/CLI loader may hand it over
