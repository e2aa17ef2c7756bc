"""`/metrics` (`flows.serving.metrics`): prometheus_client's exposition of a registry per app, with the families
and label sets the scorer has always had, parsed back by prometheus_client's own parser."""

from __future__ import annotations

import types

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flows.serving.metrics import ServerMetrics

FAMILIES = {
    ("ctrpipe_score_requests", "counter"): {"code"},
    ("ctrpipe_score_rows", "counter"): {"outcome"},
    ("ctrpipe_score_request_errors", "counter"): {"reason"},
    ("ctrpipe_score_refused", "counter"): {"reason"},
    ("ctrpipe_score_latency_seconds", "histogram"): {"le"},
    ("ctrpipe_score_batches", "counter"): set(),
    ("ctrpipe_score_batch_wait_seconds", "counter"): set(),
    ("ctrpipe_score_stage_seconds", "counter"): {"stage"},
    ("ctrpipe_model_info", "gauge"): {"version", "model"},
    ("ctrpipe_model_age_seconds", "gauge"): set(),
    ("ctrpipe_model_reloads", "counter"): {"outcome"},
}
"""(family, type) -> the label names of its samples, as the scorer exposed them before prometheus_client."""
STATS = types.SimpleNamespace(batches=3, wait_s=0.25, times=types.SimpleNamespace(seconds={"forward": 1.25}))
MODEL = types.SimpleNamespace(version="v00001", manifest={"model_name": "ctr", "exported": "2026-01-01T00:00:00"})


def _counted() -> ServerMetrics:
    m = ServerMetrics()
    m.answered(200, 0.003)
    m.answered(401, 7.0)
    m.request_errors["unauthorized"] += 1  # as the app counts them
    m.request_errors["unauthorized"] += 1
    m.scored(4, ['bad label: "2"', 'bad "x\ny": z'])
    return m


def _samples(text: str) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_families_and_label_sets_are_the_scorers_own() -> None:
    text = _counted().exposition(model=MODEL, batch_stats=STATS, switches=1, refusals=0)
    families = list(text_string_to_metric_families(text))
    assert {(f.name, f.type): {k for s in f.samples for k in s.labels} for f in families} == FAMILIES
    assert [(f.name, f.type) for f in families] == list(FAMILIES)  # in their order, each with its HELP
    assert all(f.documentation for f in families) and "_created" not in text
    got = _samples(text)
    assert got["ctrpipe_score_requests_total", (("code", "401"),)] == 1
    assert got["ctrpipe_score_request_errors_total", (("reason", "unauthorized"),)] == 2
    assert got["ctrpipe_score_rows_total", (("outcome", "refused"),)] == 2
    assert got["ctrpipe_score_refused_total", (("reason", 'bad "x\ny"'),)] == 1  # escaped and read back
    assert got["ctrpipe_score_latency_seconds_bucket", (("le", "0.005"),)] == 1
    assert got["ctrpipe_score_latency_seconds_bucket", (("le", "+Inf"),)] == 2
    assert got["ctrpipe_model_info", (("model", "ctr"), ("version", "v00001"))] == 1
    idle = ServerMetrics().exposition(model=None, batch_stats=STATS, switches=0, refusals=0)
    assert _samples(idle)["ctrpipe_score_rows_total", (("outcome", "scored"),)] == 0  # both outcomes from the start
    assert not [k for k in _samples(idle) if k[0] in ("ctrpipe_model_info", "ctrpipe_model_age_seconds")]


def test_each_app_exposes_a_registry_of_its_own_with_prometheus_client() -> None:
    one, other = _counted(), ServerMetrics()
    assert isinstance(one.registry, CollectorRegistry) and one.registry is not other.registry
    text = one.exposition(model=MODEL, batch_stats=STATS, switches=1, refusals=0)
    own = _samples(generate_latest(one.registry).decode())  # between scrapes: what the app counts itself
    assert own and own.items() <= _samples(text).items()
    assert {k[0] for k in own} == {
        "ctrpipe_score_requests_total",
        "ctrpipe_score_rows_total",
        "ctrpipe_score_request_errors_total",
        "ctrpipe_score_refused_total",
        "ctrpipe_score_latency_seconds_bucket",
        "ctrpipe_score_latency_seconds_count",
        "ctrpipe_score_latency_seconds_sum",
    }
    assert not any(k[0] == "ctrpipe_score_requests_total" for k in _samples(generate_latest(other.registry).decode()))
    assert "ctrpipe_" not in generate_latest(REGISTRY).decode()  # nothing in prometheus_client's global registry
