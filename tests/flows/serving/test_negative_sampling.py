"""Issue 52, rare positives: a bundle carries the keep-rate of negatives its model trained with, and the scorer
corrects every score as evaluation does; a bundle from before it was recorded reads 1.0."""

from __future__ import annotations

import numpy as np
import pytest

from flows.serving.bundle import BundleError, BundleReader
from flows.serving.model import ScoreRequest, ServingMeta, load_model
from tests.helpers.formats import sample
from tests.helpers.serving import criteo_line, write_tiny_bundle
from trainer.sampling import corrected_probability


def test_the_scorer_corrects_every_score_for_the_keep_rate_the_bundle_records(tmp_path) -> None:
    write_tiny_bundle(str(tmp_path / "all"))
    write_tiny_bundle(str(tmp_path / "sampled"), negative_sampling=0.25)
    plain, sampled = (load_model([BundleReader(str(tmp_path / n))]) for n in ("all", "sampled"))
    assert (plain.keep_rate, sampled.keep_rate) == (1.0, 0.25)
    lines = [criteo_line(i) for i in range(40)]  # 40 lines: the small-batch path and the frame path
    for batch in (lines[:3], lines):
        want = corrected_probability(np.array(plain.score_batch([ScoreRequest("lines", batch)])[0].scores), 0.25)
        got = sampled.score_batch([ScoreRequest("lines", batch)])[0].scores
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_an_old_bundle_reads_keep_rate_1_and_a_bad_one_is_refused() -> None:
    assert ServingMeta.from_dict(sample("model-v2.json"), where="model.json").negative_sampling == 1.0
    with pytest.raises(BundleError, match=r"model.json negative_sampling must be in \(0, 1\]"):
        ServingMeta.from_dict({**sample("model-v2.json"), "negative_sampling": 0}, where="model.json")
