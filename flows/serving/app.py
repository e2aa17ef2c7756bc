"""The scorer's HTTP API (Starlette, an ASGI app; `flows.serving.server` runs it on uvicorn).

    POST /v1/score   {"lines": ["<raw log line>", ...]} or {"rows": [{"<field>": value, ...}, ...]}, or a CSV body
                     (text/csv) whose header names the columns
                     -> 200 {"model_version": "v00002", "scores": [p | null, ...], "errors": [{"index", "reason"}]}
    GET  /v1/model   version, trained dates, AUC, export time of the model being served
    GET  /metrics    Prometheus text format (`flows.serving.metrics`); open like the probes
    GET  /healthz    200 while the process runs (liveness)
    GET  /readyz     200 once a model is loaded, else 503 (readiness)

A line may carry the label column or not, and may hold only the columns the model reads (`flows.serving.lines`
says which field counts mean what); `"labelled": true | false` beside `"lines"` settles a count with two
meanings for every line of the request.  A malformed line gets `null` and the reason
ingest would quarantine it for (a wrong or ambiguous field count names the readings); the other lines are
scored.  What is wrong with the request itself gets a 4xx and `{"error": "..."}`, never a 500:
400 invalid JSON or CSV or body shape, 401 missing or wrong bearer token (only with `auth_token`),
413 body over `max_body_bytes` or more than `max_lines` entries, 415 a content type other than
application/json or text/csv, 422 entries of the wrong type, 503 no model loaded yet; a failure while scoring
(a bug, a broken bundle) is a 500 with its reason.  With a token, `/v1/*` needs
`Authorization: Bearer <token>`; the probes and `/metrics` stay open.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from flows.serving.batcher import MicroBatcher
from flows.serving.lines import csv_rows
from flows.serving.metrics import CONTENT_TYPE, ServerMetrics
from flows.serving.model import ScoreRequest
from flows.serving.reload import ModelHolder, Reloader

log = logging.getLogger("ctrpipe.serve")
access = logging.getLogger("ctrpipe.serve.access")
ERROR_REASONS = {
    400: "bad_request",
    401: "unauthorized",
    413: "too_large",
    415: "content_type",
    422: "bad_entries",
    500: "scoring_failed",
    503: "no_model",
}
"""HTTP status -> the reason label of `ctrpipe_score_request_errors_total`."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiLimits:
    max_body_bytes: int = 8 << 20
    """Largest request body accepted (413 above)."""
    max_lines: int = 10_000
    """Most lines or rows in one request (413 above)."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024 or self.max_lines < 1:
            raise ValueError(
                f"max_body_bytes must be >= 1024 and max_lines >= 1, got {self.max_body_bytes}, {self.max_lines}"
            )


class RequestError(Exception):
    """A request the API answers with a 4xx and this message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_request(request: Request, limits: ApiLimits) -> ScoreRequest:
    """The entries of a score request: a JSON body (`entries`) or a CSV one (`csv_entries`), with the content type,
    size and syntax checked (`RequestError` otherwise)."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if ctype not in ("application/json", "text/csv"):
        raise RequestError(415, f"content type must be application/json or text/csv, got {ctype or 'none'!r}")
    body = await _read_bytes(request, limits)
    if ctype == "text/csv":
        return csv_entries(body, limits)
    try:
        payload = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"invalid JSON: {exc}") from None
    return entries(payload, limits)


async def _read_bytes(request: Request, limits: ApiLimits) -> bytearray:
    """The body, refused (413) once over the size limit."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise RequestError(413, f"body of {declared} bytes is over the limit of {limits.max_body_bytes} bytes")
    body = bytearray()
    async for chunk in request.stream():  # a chunked body has no declared length: count as it comes
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise RequestError(413, f"body is over the limit of {limits.max_body_bytes} bytes")
    return body


def csv_entries(body: bytes | bytearray, limits: ApiLimits) -> ScoreRequest:
    """The rows of a CSV body whose header names the columns (`flows.serving.lines.csv_rows`)."""
    try:
        rows, refused = csv_rows(bytes(body).decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"invalid CSV: not UTF-8 ({exc})") from None
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None
    if len(rows) > limits.max_lines:
        raise RequestError(413, f"{len(rows)} rows in one request, the limit is {limits.max_lines}: split it")
    return ScoreRequest("rows", rows, refused=tuple(refused))


def entries(payload: Any, limits: ApiLimits) -> ScoreRequest:
    """The entries of a score request (`RequestError` when its shape is wrong)."""
    if not isinstance(payload, dict):
        raise RequestError(
            400, f'body must be an object {{"lines": [...]}} or {{"rows": [...]}}, got {type(payload).__name__}'
        )
    keys = set(payload)
    if len(keys & {"lines", "rows"}) != 1 or keys - {"lines", "rows", "labelled"}:
        raise RequestError(
            400, f'body must hold exactly one of "lines" or "rows" (and "labelled" with lines), got keys {sorted(keys)}'
        )
    kind = "lines" if "lines" in payload else "rows"
    labelled = payload.get("labelled")
    if labelled is not None and (kind != "lines" or not isinstance(labelled, bool)):
        raise RequestError(422, f'"labelled" goes with "lines" and is true or false, got {labelled!r} with "{kind}"')
    items = payload[kind]
    if not isinstance(items, list):
        raise RequestError(422, f"{kind} must be a list, got {type(items).__name__}")
    if len(items) > limits.max_lines:
        raise RequestError(413, f"{len(items)} {kind} in one request, the limit is {limits.max_lines}: split it")
    if kind == "lines" and (bad := next((i for i, x in enumerate(items) if not isinstance(x, str)), None)) is not None:
        raise RequestError(422, f"lines[{bad}] must be a string (one raw log line), got {type(items[bad]).__name__}")
    return ScoreRequest(kind, items, labelled)


def build_app(
    holder: ModelHolder,
    batcher: MicroBatcher,
    *,
    limits: ApiLimits,
    reloader: Reloader | None = None,
    auth_token: str | None = None,
    access_log: bool = False,
    metrics: ServerMetrics | None = None,
) -> Starlette:
    """The ASGI app over the served model (see the module docstring).

    Args:
        holder: the model being served (replaced by `reloader`).
        batcher: scores the requests (started and stopped with the app).
        limits: request size limits.
        reloader: polls for new versions while the app runs (None: a pinned bundle).
        auth_token: the bearer token `/v1/*` requires (None: no auth).
        access_log: log one line per request (`ctrpipe.serve.access`: client, method, path, status, entries,
            milliseconds, version).
        metrics: the counters `/metrics` shows (a fresh set when None).
    """
    api = _Api(holder, batcher, limits, metrics or ServerMetrics(), auth_token=auth_token, access_log=access_log)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        batcher.start()
        poller = asyncio.get_running_loop().create_task(reloader.run()) if reloader else None
        try:
            yield
        finally:
            if poller is not None:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
            await batcher.stop()

    routes = [
        Route("/v1/score", api.score, methods=["POST"]),
        Route("/v1/model", api.model_info, methods=["GET"]),
        Route("/metrics", api.metrics_text, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


@dataclass
class _Seen:
    """What the access log says of a score request, as far as it got: its entries and the version scoring them."""

    entries: int = 0
    version: str = "-"


class _Api:
    """The endpoints of `build_app` over one served model holder, batcher and set of counters."""

    def __init__(
        self,
        holder: ModelHolder,
        batcher: MicroBatcher,
        limits: ApiLimits,
        metrics: ServerMetrics,
        *,
        auth_token: str | None,
        access_log: bool,
    ) -> None:
        self.holder, self.batcher, self.limits, self.metrics = holder, batcher, limits, metrics
        self.expected = f"Bearer {auth_token}".encode() if auth_token else None
        self.access_log = access_log

    def authorized(self, request: Request) -> bool:
        if self.expected is None:
            return True
        return hmac.compare_digest(request.headers.get("authorization", "").encode(), self.expected)

    async def score(self, request: Request) -> Response:
        """POST /v1/score: the scores of the request's lines or rows, or a 4xx/5xx saying what is wrong."""
        t0 = time.perf_counter()
        seen = _Seen()
        try:
            response = await self._scores(request, seen)
        except RequestError as exc:
            self.metrics.request_errors[ERROR_REASONS.get(exc.status, str(exc.status))] += 1
            response = _error(exc.status, str(exc))
        seconds = time.perf_counter() - t0
        self.metrics.answered(response.status_code, seconds)
        if self.access_log:
            client = request.client.host if request.client else "-"
            access.info(
                '%s "POST /v1/score" %d %d entries %.1fms %s',
                client,
                response.status_code,
                seen.entries,
                seconds * 1000,
                seen.version,
            )
        return response

    async def _scores(self, request: Request, seen: _Seen) -> Response:
        """The 200 response of a score request; `seen` learns its entries and the version scoring them.

        Raises:
            RequestError: what is wrong with the request, or a failed scoring (500).
        """
        if not self.authorized(request):
            raise RequestError(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        wanted = await read_request(request, self.limits)
        seen.entries = len(wanted)
        model = self.holder.current  # the request stays on this version, whatever the reloader does meanwhile
        if model is None:
            raise RequestError(503, "no model loaded yet (see GET /readyz)")
        seen.version = version = model.version
        try:
            scored = await self.batcher.score(model, wanted)
        except Exception as exc:  # a bug or a broken bundle: a 500 that says so, never a dropped connection
            log.exception("scoring failed on %s", version)
            raise RequestError(500, f"scoring failed: {type(exc).__name__}: {exc}") from exc
        self.metrics.scored(len(scored.scores) - len(scored.errors), [r for _, r in scored.errors])
        return JSONResponse(
            {
                "model_version": version,
                "scores": scored.scores,
                "errors": [{"index": i, "reason": r} for i, r in scored.errors],
            }
        )

    async def metrics_text(self, request: Request) -> Response:
        """GET /metrics: the counters in Prometheus text format."""
        holder = self.holder
        return Response(
            self.metrics.exposition(
                model=holder.current, batch_stats=self.batcher.stats, switches=holder.switches, refusals=holder.refusals
            ),
            media_type=CONTENT_TYPE,
        )

    async def model_info(self, request: Request) -> JSONResponse:
        """GET /v1/model: what the served model is, its switches and the batching so far."""
        if not self.authorized(request):
            return _error(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        model = self.holder.current
        if model is None:
            return _error(503, "no model loaded yet (see GET /readyz)")
        return JSONResponse(
            {
                **model.info(),
                "switches": self.holder.switches,
                "refused": self.holder.refused,
                "batching": self.batcher.stats.as_dict(),
            }
        )

    async def healthz(self, request: Request) -> JSONResponse:
        """GET /healthz: the process runs."""
        return JSONResponse({"status": "alive"})

    async def readyz(self, request: Request) -> JSONResponse:
        """GET /readyz: a model is loaded."""
        model = self.holder.current
        if model is None:
            return JSONResponse({"status": "not ready", "reason": "no model loaded yet"}, status_code=503)
        return JSONResponse({"status": "ready", "model_version": model.version})
