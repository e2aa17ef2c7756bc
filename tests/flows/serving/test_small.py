"""The small-batch path gives exactly the feature path's frame for plain lines, and declines everything else."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flows.serving.small import SMALL_BATCH, small_features
from pipeline.encode.feature_spec import FeatureSpec
from pipeline.encode.keys import feature_keys
from pipeline.schema import get_schema

CRITEO = get_schema("criteo")


def _spec(lines: list[str]) -> FeatureSpec:
    """A spec admitting the values seen at least twice in `lines` (so both admitted and OOV keys occur)."""
    fields = [line.split("\t") for line in lines]
    seen = np.concatenate([feature_keys(j, [f[14 + j] for f in fields if len(f) == 40]) for j in range(26)])
    keys, counts = np.unique(seen, return_counts=True)
    return FeatureSpec(schema=CRITEO, admitted=keys[counts >= 2])


def _small_frames(lines: list[str], spec: FeatureSpec) -> list[pd.DataFrame]:
    """The small path's frames of the plain batches of `lines`, each checked equal to the feature path's."""
    frames = []
    for lo in range(0, len(lines), SMALL_BATCH):
        batch = lines[lo : lo + SMALL_BATCH]
        small, full = small_features(batch, spec), spec.parse_lines(batch)
        if small is None:
            continue
        pd.testing.assert_frame_equal(small.features, full.features, check_exact=True)
        assert small.index.tolist() == full.index.tolist() and small.errors == full.errors == []
        frames.append(small.features)
    return frames


def test_real_criteo_lines_get_the_feature_paths_frame_exactly(shared_data):
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_text().splitlines()[:3000]
    assert len(_small_frames(lines, _spec(lines))) > len(lines) // SMALL_BATCH // 2  # most real batches are plain


@pytest.mark.parametrize(
    "value",
    ["0", "-0", "-5", "7", "123456789012345", "", "999", "1.5", "0.1", "-2.25e3", "1e-400", "3.0000000000000001"],
)
def test_plain_numbers_and_missing_values_match(value):
    fields = ["1", *[value] * 13, *[f"é{j}" if j % 2 else "" for j in range(26)]]
    spec = FeatureSpec(schema=CRITEO, admitted=np.sort(feature_keys(1, ["é1"])))
    line = "\t".join(fields)
    small = small_features([line, line.replace("é1", "x")], spec)
    assert small is not None
    pd.testing.assert_frame_equal(
        small.features, spec.parse_lines([line, line.replace("é1", "x")]).features, check_exact=True
    )


@pytest.mark.parametrize(
    "line",
    [
        "2" + "\t1" * 13 + "\tc" * 26,  # a bad label: the feature path says why
        "1" + "\t007" + "\t1" * 12 + "\tc" * 26,  # leading zeros, signs, spaces, no digit first: parsers may differ
        "1" + "\t.5" + "\t1" * 12 + "\tc" * 26,
        "1" + "\t1e999" + "\t1" * 12 + "\tc" * 26,  # not finite: the feature path says why
        "1" + "\t+1" + "\t1" * 12 + "\tc" * 26,
        "1" + "\t 1" + "\t1" * 12 + "\tc" * 26,
        "1" + "\t1" * 13,  # a cut line (padded by ingest)
        "1" + "\t1" * 13 + "\tc" * 25 + "\t\ud800",  # not encodable
    ],
)
def test_anything_not_plain_goes_to_the_feature_path(line):
    spec = FeatureSpec(schema=CRITEO, admitted=np.zeros(0, np.int64))
    assert small_features([line], spec) is None
    assert small_features(["1" + "\t1" * 13 + "\tc" * 26] * (SMALL_BATCH + 1), spec) is None  # too many for it


def test_a_small_batch_is_scored_exactly_as_its_frame_would_be(tmp_path):
    from flows.serving.bundle import BundleReader
    from flows.serving.model import ScoreRequest, load_model
    from flows.serving.small import small_batch
    from tests.helpers.serving import criteo_line, write_tiny_bundle

    write_tiny_bundle(str(tmp_path / "b"))
    model = load_model([BundleReader(str(tmp_path / "b"))])
    lines = [criteo_line(i, label=i % 2) for i in range(8)]
    assert model.small_path and small_batch(lines, model.spec) is not None  # the path is taken
    served = model.score_batch([ScoreRequest("lines", lines[:3]), ScoreRequest("lines", lines[3:])])
    framed = model.score_features(model.spec.parse_lines(lines).features)
    assert served[0].scores + served[1].scores == framed.tolist()


def test_real_criteo_lines_with_own_keys_get_the_feature_paths_frame_exactly(shared_data):
    """A model with a companion reads the values' own keys `r_<j>`: the small path gives them too."""
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_text().splitlines()[:640]
    base = _spec(lines)
    frames = _small_frames(lines, FeatureSpec(schema=CRITEO, admitted=base.admitted, raw_keys=True))
    assert frames
    for f in frames:  # a value outside the vocabulary keeps its own key beside the OOV key
        assert (f[[f"r_{j}" for j in range(26)]].to_numpy() != f[[f"k_{j}" for j in range(26)]].to_numpy()).any()


def test_a_small_batch_of_a_model_with_a_companion_is_scored_exactly_as_its_frame_would_be(tmp_path):
    import dataclasses

    from flows.serving.bundle import BundleReader
    from flows.serving.model import ScoreRequest, load_model
    from tests.helpers.serving import criteo_line, write_tiny_bundle
    from trainer.companion.fit import fit_rows
    from trainer.companion.poly2 import Poly2Config

    write_tiny_bundle(str(tmp_path / "b"))
    plain = load_model([BundleReader(str(tmp_path / "b"))])
    lines = [criteo_line(i, label=i % 2) for i in range(8)]
    spec = dataclasses.replace(plain.spec, raw_keys=True)
    rows = spec.parse_lines(lines).features
    own, dense = rows[[f"r_{j}" for j in range(26)]].to_numpy(), rows[[f"d_{i}" for i in range(13)]].to_numpy()
    fitted, _ = fit_rows(own, dense, np.arange(8) % 2, config=Poly2Config(bits=14, cs=(1.0,)))
    model = dataclasses.replace(plain, spec=spec, companion=fitted)
    assert model.small_path
    served = model.score_batch([ScoreRequest("lines", lines[:3]), ScoreRequest("lines", lines[3:])])
    framed = model.score_features(spec.parse_lines(lines).features)
    assert served[0].scores + served[1].scores == framed.tolist()
    assert framed.tolist() != plain.score_features(plain.spec.parse_lines(lines).features).tolist()  # it blends
