"""The scorer's numbers in the Prometheus text format (`GET /metrics`), kept by hand: no client library.

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

Everything is updated on the server's event loop (or read from the batcher's and the holder's
counters), so no lock is needed; reading is a snapshot at scrape time.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from collections import Counter
from typing import Any

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds (seconds) of the latency histogram's buckets."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    """Cumulative-bucket histogram of observed values (the Prometheus histogram type)."""

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        i = 0
        while i < len(self.bounds) and value > self.bounds[i]:
            i += 1
        self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out, total = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            total += n
            out.append(f'{name}_bucket{{le="{_number(bound)}"}} {total}')
        return [*out, f"{name}_sum {_number(self.sum)}", f"{name}_count {self.count}"]


class ServerMetrics:
    """What the app counts per request (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: Counter[int] = Counter()
        self.rows: Counter[str] = Counter()
        self.request_errors: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.latency = Histogram()

    def answered(self, status: int, seconds: float) -> None:
        self.requests[status] += 1
        self.latency.observe(seconds)

    def scored(self, scored: int, refused_reasons: list[str]) -> None:
        self.rows["scored"] += scored
        self.rows["refused"] += len(refused_reasons)
        for reason in refused_reasons:
            self.refused[reason.split(":", 1)[0]] += 1  # the rule, as ingest's summaries group them

    def exposition(self, *, model: Any, batch_stats: Any, switches: int, refusals: int) -> str:
        """The text `/metrics` answers (`model`: the `ServingModel` served, or None)."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str, samples: list[str]) -> None:
            out.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *samples])

        family(
            "ctrpipe_score_requests_total",
            "counter",
            "/v1/score requests answered, by HTTP status.",
            [f'ctrpipe_score_requests_total{{code="{c}"}} {n}' for c, n in sorted(self.requests.items())],
        )
        family(
            "ctrpipe_score_rows_total",
            "counter",
            "Entries (lines or rows) scored, or refused with a null score.",
            [f'ctrpipe_score_rows_total{{outcome="{k}"}} {self.rows[k]}' for k in ("scored", "refused")],
        )
        family(
            "ctrpipe_score_request_errors_total",
            "counter",
            "Requests answered with an error status, by reason.",
            [
                f'ctrpipe_score_request_errors_total{{reason="{_label(r)}"}} {n}'
                for r, n in sorted(self.request_errors.items())
            ],
        )
        family(
            "ctrpipe_score_refused_total",
            "counter",
            "Entries refused, by the rule of their reason.",
            [f'ctrpipe_score_refused_total{{reason="{_label(r)}"}} {n}' for r, n in sorted(self.refused.items())],
        )
        family(
            "ctrpipe_score_latency_seconds",
            "histogram",
            "/v1/score latency, from the request to its answer.",
            self.latency.lines("ctrpipe_score_latency_seconds"),
        )
        family(
            "ctrpipe_score_batches_total",
            "counter",
            "Batches scored by the micro-batcher.",
            [f"ctrpipe_score_batches_total {batch_stats.batches}"],
        )
        family(
            "ctrpipe_score_batch_wait_seconds_total",
            "counter",
            "Seconds requests waited in the micro-batcher's queue, summed over requests.",
            [f"ctrpipe_score_batch_wait_seconds_total {_number(batch_stats.wait_s)}"],
        )
        family(
            "ctrpipe_score_stage_seconds_total",
            "counter",
            "Seconds spent per scoring stage, summed over batches.",
            [
                f'ctrpipe_score_stage_seconds_total{{stage="{k}"}} {_number(v)}'
                for k, v in batch_stats.times.seconds.items()
            ],
        )
        info, age = [], []
        if model is not None:
            name = model.manifest.get("model_name") or ""
            info.append(f'ctrpipe_model_info{{version="{_label(model.version)}",model="{_label(name)}"}} 1')
            exported = model_age_seconds(model.manifest.get("exported"))
            if exported is not None:
                age.append(f"ctrpipe_model_age_seconds {_number(exported)}")
        family("ctrpipe_model_info", "gauge", "1 for the model version served.", info)
        family("ctrpipe_model_age_seconds", "gauge", "Seconds since the served bundle was exported.", age)
        family(
            "ctrpipe_model_reloads_total",
            "counter",
            "Switches to a new model version (ok) and bundles refused (the old one kept serving).",
            [
                f'ctrpipe_model_reloads_total{{outcome="ok"}} {switches}',
                f'ctrpipe_model_reloads_total{{outcome="refused"}} {refusals}',
            ],
        )
        return "\n".join(out) + "\n"


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


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
