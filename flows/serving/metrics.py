"""The scorer's numbers in the Prometheus text format (`GET /metrics`), with prometheus_client.

    ctrpipe_score_requests_total{code}              /v1/score requests answered, by HTTP status
    ctrpipe_score_rows_total{outcome}               entries scored, or refused (null score)
    ctrpipe_score_request_errors_total{reason}      requests answered with a 4xx/5xx, by reason
    ctrpipe_score_refused_total{reason}             entries refused, by the rule of their reason ("bad label", ...)
    ctrpipe_score_latency_seconds                   histogram of /v1/score latency (body read to answer)
    ctrpipe_score_batches_total, ctrpipe_score_batch_wait_seconds_total
    ctrpipe_score_stage_seconds_total{stage}        seconds per scoring stage (prepare, features, lookup, forward,
    score)
    ctrpipe_model_info{version,model}               1 for the version served
    ctrpipe_model_age_seconds                       seconds since the served bundle was exported
    ctrpipe_model_reloads_total{outcome}            switches to a new version (ok) and bundles refused

Each app has a registry of its own (`ServerMetrics.registry`, not prometheus_client's global one): the counters
the app updates per request, and the batcher's and the holder's counters read at scrape time.  The counters'
`_created` series are left out: the families are the ones above.  Everything is updated on the server's event
loop, and prometheus_client's metrics take their own locks.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds (seconds) of the latency histogram's buckets."""
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class _Tally:
    """`tally[value] += n` on a counter with the one label `label` (`ServerMetrics.request_errors`)."""

    def __init__(self, counter: Counter, label: str) -> None:
        self._counter, self._label = counter, label

    def __getitem__(self, value: str) -> float:
        samples = (s for m in self._counter.collect() for s in m.samples if s.name.endswith("_total"))
        return next((s.value for s in samples if s.labels[self._label] == value), 0.0)

    def __setitem__(self, label: str, total: float) -> None:
        self._counter.labels(label).inc(total - self[label])


class ServerMetrics:
    """What the app counts per request, and its registry (see the module docstring)."""

    def __init__(self) -> None:
        # not registered anywhere: `collect` hands them to `registry` without their `_created` series
        self._requests = Counter(
            "ctrpipe_score_requests", "/v1/score requests answered, by HTTP status.", ["code"], registry=None
        )
        self._rows = Counter(
            "ctrpipe_score_rows",
            "Entries (lines or rows) scored, or refused with a null score.",
            ["outcome"],
            registry=None,
        )
        for outcome in ("scored", "refused"):
            self._rows.labels(outcome)
        self._errors = Counter(
            "ctrpipe_score_request_errors",
            "Requests answered with an error status, by reason.",
            ["reason"],
            registry=None,
        )
        self._refused = Counter(
            "ctrpipe_score_refused", "Entries refused, by the rule of their reason.", ["reason"], registry=None
        )
        self._latency = Histogram(
            "ctrpipe_score_latency_seconds",
            "/v1/score latency, from the request to its answer.",
            buckets=LATENCY_BUCKETS,
            registry=None,
        )
        self.request_errors = _Tally(self._errors, "reason")
        """`request_errors[reason] += 1` counts a request answered with an error (`error`)."""
        self._scrape: dict[str, Any] = {}
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def answered(self, status: int, seconds: float) -> None:
        self._requests.labels(str(status)).inc()
        self._latency.observe(seconds)

    def error(self, reason: str) -> None:
        """A request answered with an error status, for `reason`."""
        self._errors.labels(reason).inc()

    def scored(self, scored: int, refused_reasons: list[str]) -> None:
        self._rows.labels("scored").inc(scored)
        self._rows.labels("refused").inc(len(refused_reasons))
        for reason in refused_reasons:
            self._refused.labels(reason.split(":", 1)[0]).inc()  # the rule, as ingest's summaries group them

    def exposition(self, *, model: Any, batch_stats: Any, switches: int, refusals: int) -> str:
        """The text `/metrics` answers (`model`: the `ServingModel` served, or None)."""
        self._scrape = {"model": model, "batch_stats": batch_stats, "switches": switches, "refusals": refusals}
        try:
            return generate_latest(self.registry).decode()
        finally:
            self._scrape = {}

    def collect(self) -> Iterator[Metric]:
        """The families of `registry`: the app's counters, and those read at scrape time (`exposition`)."""
        for own in (self._requests, self._rows, self._errors, self._refused, self._latency):
            for family in own.collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield family
        if self._scrape:
            yield from _read_at_scrape(**self._scrape)


def _read_at_scrape(*, model: Any, batch_stats: Any, switches: int, refusals: int) -> Iterator[Metric]:
    """The batcher's and the model holder's numbers as metric families."""
    yield CounterMetricFamily(
        "ctrpipe_score_batches", "Batches scored by the micro-batcher.", value=batch_stats.batches
    )
    yield CounterMetricFamily(
        "ctrpipe_score_batch_wait_seconds",
        "Seconds requests waited in the micro-batcher's queue, summed over requests.",
        value=batch_stats.wait_s,
    )
    stages = CounterMetricFamily(
        "ctrpipe_score_stage_seconds", "Seconds spent per scoring stage, summed over batches.", labels=["stage"]
    )
    for stage, seconds in batch_stats.times.seconds.items():
        stages.add_metric([stage], seconds)
    yield stages
    info = GaugeMetricFamily("ctrpipe_model_info", "1 for the model version served.", labels=["version", "model"])
    age = GaugeMetricFamily("ctrpipe_model_age_seconds", "Seconds since the served bundle was exported.")
    if model is not None:
        info.add_metric([model.version, model.manifest.get("model_name") or ""], 1)
        exported = model_age_seconds(model.manifest.get("exported"))
        if exported is not None:
            age.add_metric([], exported)
    yield info
    yield age
    reloads = CounterMetricFamily(
        "ctrpipe_model_reloads",
        "Switches to a new model version (ok) and bundles refused (the old one kept serving).",
        labels=["outcome"],
    )
    reloads.add_metric(["ok"], switches)
    reloads.add_metric(["refused"], refusals)
    yield reloads


def model_age_seconds(exported: Any, now: float | None = None) -> float | None:
    """Seconds since the ISO time `exported` (None when absent or unreadable)."""
    if not isinstance(exported, str):
        return None
    try:
        when = _dt.datetime.fromisoformat(exported)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return max((now if now is not None else time.time()) - when.timestamp(), 0.0)
