"""A loaded bundle scores raw lines, memory-mapped or not, and a bundle that cannot score is refused."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from flows.serving.bundle import MANIFEST, MODEL_JSON, BundleError, BundleReader
from flows.serving.export import write_full_bundle
from flows.serving.model import ServingMeta, load_model
from pipeline.encode.feature_spec import FeatureSpec
from tests.helpers.formats import newer, sample
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
    write_full_bundle(
        str(tmp_path / "nan"),
        meta=meta,
        spec=spec,
        rows=rows,
        program=export.program_bytes(export.export_program(network)),
        manifest={"version": "v00002", "dtype": "float32"},
    )
    with pytest.raises(BundleError, match="smoke score gave"):
        load_model([BundleReader(str(tmp_path / "nan"))])


# ---- an older scorer loads a newer trainer's bundle ---------------------------------------------
def _replace_file(bundle, name: str, content: bytes) -> None:
    """Rewrite one file of a committed bundle and its manifest entry, as a newer exporter would have."""
    (bundle / name).write_bytes(content)
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(content).hexdigest(), "bytes": len(content)}
    (bundle / MANIFEST).write_text(json.dumps(manifest))


def test_the_serving_meta_of_todays_model_json_is_read():
    meta = ServingMeta.from_dict(sample("model-v2.json"), where="model.json")
    assert meta.dim == 8 and len(meta.key_columns) == 26 and meta.init_std > 0 and meta.bag_columns == ()


def test_a_bundle_whose_model_json_has_retired_keys_and_new_fields_loads_and_scores(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    data = json.loads((tmp_path / "b" / MODEL_JSON).read_text())
    _replace_file(
        tmp_path / "b",
        MODEL_JSON,
        json.dumps(newer(data, optim="retired_lr", trainer="retired_key", model_config="retired_model_key")).encode(),
    )
    model = load_model([BundleReader(str(tmp_path / "b"))])
    p = model.score_features(model.parse(lines=[criteo_line(i) for i in range(5)]).features)
    assert p.shape == (5,) and ((p > 0) & (p < 1)).all()


def test_a_bundle_whose_model_json_is_of_a_newer_version_is_refused_naming_it(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    data = json.loads((tmp_path / "b" / MODEL_JSON).read_text())
    _replace_file(tmp_path / "b", MODEL_JSON, json.dumps({**data, "format": "ctr-pipeline-model/5"}).encode())
    with pytest.raises(
        BundleError,
        match=r"model.json has format 'ctr-pipeline-model/5', written by a newer "
        r"ctr-pipeline; this code reads ctr-pipeline-model/2, ctr-pipeline-model/3, "
        r"ctr-pipeline-model/4: upgrade",
    ):
        load_model([BundleReader(str(tmp_path / "b"))])


def test_the_network_gets_contiguous_dense_rows(tmp_path):
    # torch's bucketize warns "searchsorted(): input value tensor is non-contiguous" from C++ (not a Python
    # warning when called from an exported program), and copies: the frame's column-major values must not reach it
    write_tiny_bundle(str(tmp_path / "b"))
    model = load_model([BundleReader(str(tmp_path / "b"))])
    seen, net = [], model.net
    model.net = lambda dense, emb: seen.append(dense.is_contiguous() and emb.is_contiguous()) or net(dense, emb)
    p = model.score_features(model.parse(lines=[criteo_line(i) for i in range(8)]).features)
    assert seen == [True] and p.shape == (8,)
