"""A loaded bundle scores raw lines, memory-mapped or not, and a bundle that cannot score is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flows.serving.bundle import BundleError, BundleReader
from flows.serving.export import write_full_bundle
from flows.serving.model import load_model
from pipeline.feature_spec import FeatureSpec
from tests.helpers.serving import (
    CRITEO,
    criteo_line,
    tiny_model,
    tiny_rows,
    write_tiny_bundle,
)
from trainer import export


def test_memory_mapped_rows_score_exactly_like_rows_in_memory(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    lines = [criteo_line(i) for i in range(40)]
    in_memory = load_model([BundleReader(str(tmp_path / "b"))])
    mapped = load_model([BundleReader(str(tmp_path / "b"))], mmap_dir=str(tmp_path / "cache"))
    a = in_memory.score_features(in_memory.parse(lines=lines).features)
    b = mapped.score_features(mapped.parse(lines=lines).features)
    assert np.array_equal(a, b) and a.shape == (40,) and ((a > 0) & (a < 1)).all()
    assert mapped.info()["mmap"] and not in_memory.info()["mmap"] and in_memory.info()["model_version"] == "v00001"
    with pytest.raises(BundleError, match="--mmap serves a full bundle"):
        load_model([BundleReader(str(tmp_path / "b"))] * 2, mmap_dir=str(tmp_path / "cache"))


def test_a_network_that_gives_no_probability_fails_the_smoke_score(tmp_path):
    meta, network = tiny_model()
    with torch.no_grad():
        network.bias.fill_(float("nan"))
    admitted, rows = tiny_rows()
    spec = FeatureSpec(schema=CRITEO, admitted=admitted)
    write_full_bundle(str(tmp_path / "nan"), meta=meta, spec=spec, rows=rows,
                      program=export.program_bytes(export.export_program(network)),
                      manifest={"version": "v00002", "dtype": "float32"})
    with pytest.raises(BundleError, match="smoke score gave"):
        load_model([BundleReader(str(tmp_path / "nan"))])
