"""Data-stage config sections: a bad value fails on construction, naming the key and the value."""

import pytest

from pipeline.config import (
    DaskConfig,
    EncodeConfig,
    IngestConfig,
    InputConfig,
    VocabConfig,
)


def test_input_format_is_a_built_in_name_or_a_yaml_schema_file():
    with pytest.raises(ValueError, match="input.format must be one of"):
        InputConfig(format="shop.json")
    assert InputConfig(format="s3://bucket/shop.yml").format.endswith(".yml")


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: IngestConfig(rows_per_partition=0), r"ingest.rows_per_partition must be >= 1, got 0"),
        (lambda: IngestConfig(block_size=10), r"ingest.block_size must be >= 1024 bytes, got 10"),
        (lambda: IngestConfig(max_bad_fraction=1.5), r"ingest.max_bad_fraction must be in \[0, 1\], got 1.5"),
        (lambda: DaskConfig(n_workers=-1), r"dask.n_workers must be >= 0, got -1"),
        (lambda: DaskConfig(memory_limit="lots"), r"dask.memory_limit must be a size such as 4GiB .*got 'lots'"),
        (
            lambda: DaskConfig(address="nonsense"),
            r"dask.address must be a scheduler address such as tcp://.*'nonsense'",
        ),
        (lambda: DaskConfig(address="tcp://host"), r"dask.address must be a scheduler address"),
        (lambda: DaskConfig(stall_timeout_s=0), r"dask.stall_timeout_s must be > 0 seconds, got 0"),
        (lambda: VocabConfig(ttl_days=0), r"vocab.ttl_days must be >= 1, got 0"),
        (lambda: VocabConfig(decay=0.0), r"vocab.decay must be in \(0, 1\], got 0.0"),
        (lambda: VocabConfig(min_count_per_field={"C3": 0}), r"vocab.min_count_per_field\['C3'\] must be an int >= 1"),
        (lambda: VocabConfig(max_keys_per_field=-1), r"vocab.max_keys_per_field must be >= 0"),
        (lambda: EncodeConfig(eval_fraction=1.0), r"encode.eval_fraction must be in \(0, 1\), got 1.0"),
    ],
)
def test_a_bad_value_names_its_key_and_value(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize("limit", ["4GiB", "512MB", "2 GB", "1000", "auto"])
def test_dask_memory_limits_dask_reads_are_accepted(limit):
    assert DaskConfig(memory_limit=limit).memory_limit == limit


@pytest.mark.parametrize("address", ["tcp://10.0.0.5:8786", "scheduler:8786", "tls://[::1]:8786", "inproc://host/1/2"])
def test_scheduler_addresses_are_accepted(address):
    assert DaskConfig(address=address).address == address
