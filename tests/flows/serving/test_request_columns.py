"""Issue 52: a request names or sends only the columns the model reads, the small-batch path serves every schema,
and no score is exactly 0 or 1."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from flows.serving.bundle import BundleReader
from flows.serving.export import write_full_bundle
from flows.serving.lines import with_labels
from flows.serving.model import ScoreRequest, ServingMeta, load_model
from flows.serving.small import SMALL_BATCH, small_batch, small_features
from pipeline.encode.feature_spec import FeatureSpec
from pipeline.encode.keys import feature_keys
from pipeline.schema import get_schema, schema_from_dict
from tests.helpers.formats import sample
from tests.helpers.serving import TINY, criteo_line, write_tiny_bundle
from trainer import export
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.eval.metrics import PROB_EPS
from trainer.eval.scoring import score_features
from trainer.model_dir import ModelMeta
from trainer.models.ctr_model import CTRModel

AVAZU = get_schema("avazu")
SHOP = schema_from_dict(  # docs/schema.md's example: a header, a timestamp, a float, a multi-valued field
    {
        "separator": ";",
        "header": True,
        "columns": ["ts", "clicked", "price", "ctr_prior", "site", "tags"],
        "label": {"column": "clicked", "positive": ["1", "yes"], "negative": ["0", "no"]},
        "timestamp": {"column": "ts", "format": "%Y-%m-%d %H:%M:%S"},
        "integer": ["price"],
        "float": ["ctr_prior"],
        "categorical": ["site"],
        "multi_valued": {"tags": "|"},
    }
)


def avazu_line(i: int, label: int = 0) -> str:
    """A valid Avazu line whose values depend on `i` (values of i % 5 repeat, so some are admitted)."""
    values = {c: f"{c}-{(i * (j + 1)) % 5}" for j, c in enumerate(AVAZU.categorical)}
    values |= {"id": f"{10**18 + i}", "click": str(label), "hour": f"141021{i % 24:02d}"}
    return ",".join(values[c] for c in AVAZU.columns)


def shop_line(i: int, rng: np.random.Generator) -> str:
    tags = "|".join(f"t{rng.integers(0, 4)}" for _ in range(rng.integers(0, 4)))  # "" (no tags) now and then
    price = "" if i % 6 == 0 else str(rng.integers(0, 400))
    prior = f"{rng.random() / 10:.{rng.integers(1, 18)}f}" if i % 5 else f"{rng.random():.3e}"
    return f"2026-03-01 00:00:{i % 60:02d};{['yes', 'no'][i % 2]};{price};{prior};s{i % 3};{tags}"


def write_avazu_bundle(url: str) -> None:
    """A full bundle of a random tiny model of the Avazu columns (no dense inputs; `hour` only dates rows)."""
    torch.manual_seed(0)
    nf = len(AVAZU.categorical)
    network = CTRModel(TINY, num_dense=0, num_fields=nf, dim=4).eval()
    meta = ModelMeta.of(
        model_name="ctr",
        model_config=TINY,
        dim=4,
        init_std=0.05,
        num_dense=0,
        num_fields=nf,
        fields=AVAZU.categorical,
        dense_columns=(),
        key_columns=tuple(f"k_{j}" for j in range(nf)),
        vocab_date="2026-01-01",
        run_tag="tiny-avazu",
        features_url="",
        init_model_url=None,
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(),
    )
    values = [[f"{c}-{v}" for v in range(3)] for c in AVAZU.categorical]
    admitted = np.unique(np.concatenate([feature_keys(j, v) for j, v in enumerate(values)]))
    emb = np.random.default_rng(0).normal(0, 0.3, (admitted.size, 4)).astype(np.float32)
    write_full_bundle(
        url,
        meta=meta,
        spec=FeatureSpec(schema=AVAZU, admitted=admitted),
        program=export.program_bytes(export.export_program(network)),
        rows=export.SparseRows(admitted, emb),
        manifest={"version": "v00001", "model_name": "ctr", "dtype": "float32"},
    )


@pytest.fixture(scope="module")
def avazu_model(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("avazu") / "b")
    write_avazu_bundle(url)
    return load_model([BundleReader(url)])


def test_only_the_columns_the_model_reads_without_a_timestamp_score_as_the_whole_line(avazu_model):
    model = avazu_model
    lines = [avazu_line(i, label=i % 2) for i in range(6)]
    rows = [dict(zip(AVAZU.columns, line.split(","), strict=True)) for line in lines]
    used = [",".join(r[c] for c in AVAZU.request_columns) for r in rows]  # 21 fields: no id, click or hour
    natural = [",".join(r[c] for c in AVAZU.columns if c not in ("id", "click")) for r in rows]  # and the hour
    named = [{c: r[c] for c in AVAZU.request_columns} for r in rows]
    csv_text = ",".join(AVAZU.request_columns) + "\n" + "\n".join(used) + "\n"
    from flows.serving.app import ApiLimits, csv_entries

    requests = [
        ScoreRequest("lines", lines),
        ScoreRequest("lines", used),
        ScoreRequest("lines", natural),
        ScoreRequest("rows", named),
        csv_entries(csv_text.encode(), ApiLimits()),
    ]
    answers = model.score_batch(requests)
    assert all(a.errors == [] for a in answers), [a.errors for a in answers]
    whole = answers[0].scores
    assert len(set(whole)) > 1 and all(a.scores == whole for a in answers[1:])
    expected = model.score_features(model.spec.parse_lines(with_labels(lines, AVAZU)[0]).features)
    assert whole == expected.tolist()  # the small path, checked against the feature path


def test_avazu_and_a_schema_with_floats_and_bags_take_the_small_path_and_get_the_feature_paths_frame(avazu_model):
    assert avazu_model.small_path
    written = with_labels([avazu_line(i) for i in range(SMALL_BATCH)], AVAZU)[0]
    assert small_batch(written, avazu_model.spec) is not None  # issue 51: Avazu never took it
    rng = np.random.default_rng(7)
    shop = with_labels([shop_line(i, rng) for i in range(4 * SMALL_BATCH)], SHOP)[0]
    seen = np.concatenate([feature_keys(j, [f"s{k}", f"t{k}"]) for j in range(2) for k in range(2)])
    for spec, lines in ((avazu_model.spec, written), (FeatureSpec(schema=SHOP, admitted=np.unique(seen)), shop)):
        for raw_keys in (False, True):
            s = FeatureSpec(schema=spec.schema, admitted=spec.admitted, raw_keys=raw_keys)
            for lo in range(0, len(lines), SMALL_BATCH):
                small, full = (
                    small_features(lines[lo : lo + SMALL_BATCH], s),
                    s.parse_lines(lines[lo : lo + SMALL_BATCH]),
                )
                assert small is not None and full.errors == []
                _assert_same_frame(small.features, full.features)


def _assert_same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    bags = [c for c in a.columns if c.startswith("bag_")]
    pd.testing.assert_frame_equal(a.drop(columns=bags), b.drop(columns=bags), check_exact=True)
    for c in bags:
        assert [list(x) for x in a[c]] == [list(x) for x in b[c]]


def test_a_timestamp_a_feature_reads_is_required_and_then_the_feature_path_scores(avazu_model):
    import dataclasses

    timed = dataclasses.replace(AVAZU, categorical=(*AVAZU.categorical, "hour_of_day"), time_features=("hour_of_day",))
    assert timed.request_columns == ("hour", *AVAZU.categorical)
    line = avazu_line(3)
    assert with_labels([line], timed)[0] == [line]  # the timestamp is kept: a feature reads it
    spec = FeatureSpec(schema=timed, admitted=avazu_model.spec.admitted)
    assert small_batch([line], spec) is None


def test_no_score_is_exactly_0_or_1_and_evaluation_clips_alike(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    model = load_model([BundleReader(str(tmp_path / "b"))])
    model.net = lambda dense, emb: (dense[:, 0] - 2.0) * 1e4  # logits of +-10^4: sigmoid gives 0.0 and 1.0
    lines = [criteo_line(i) for i in range(8)]
    served = model.score_batch([ScoreRequest("lines", lines)])[0].scores
    assert min(served) == PROB_EPS and max(served) == 1 - PROB_EPS and model.score_eps == PROB_EPS
    features = model.spec.parse_lines(lines).features
    evaluated = score_features(model.net, model.table.lookup, model.schema, "mean", features)
    assert served == evaluated.tolist()


def test_the_eps_is_recorded_in_model_json_and_an_old_bundle_reads_the_default():
    assert ServingMeta.from_dict(sample("model-v2.json"), where="model.json").score_eps == PROB_EPS
    meta = ServingMeta.from_dict({**sample("model-v2.json"), "score_eps": 1e-5}, where="model.json")
    assert meta.score_eps == 1e-5 and ModelMeta.from_dict(sample("model-v2.json")).to_dict()["score_eps"] == PROB_EPS
