"""`ctrpipe score-server`: load a bundle, then serve `flows.serving.app` on uvicorn until stopped.

Starlette and uvicorn are the optional `serve` extra.  The server binds 127.0.0.1 unless told
otherwise; the bearer token, when there is one, is read from the environment variable the config
names and never logged or stored.  With `latest`, a server started before the first publish
answers `/readyz` with 503 and loads the first bundle the pointer names; a pinned bundle that does
not load stops the server with the reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from flows.serving.reload import BundleSource, ModelHolder, Reloader

log = logging.getLogger("ctrpipe.serve")


@dataclass(frozen=True, kw_only=True, slots=True)
class ServeConfig:
    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 unless a deployment says otherwise (0.0.0.0 in a pod)."""
    port: int = 8000
    reload_every_s: float = 30.0
    """Seconds between polls of the bundle pointer (`--model latest` only)."""
    max_body_bytes: int = 8 << 20
    """Largest request body (413 above)."""
    max_lines: int = 10_000
    """Most lines or rows per request (413 above)."""
    max_batch_rows: int = 4096
    """Rows above which no more requests join a micro-batch."""
    max_wait_ms: float = 0.0
    """How long a micro-batch waits for more requests once none is queued (0: score at once)."""
    auth_token_env: str = ""
    """Name of the environment variable holding the bearer token; empty: no auth."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.reload_every_s <= 0:
            raise ValueError(f"--reload-every must be > 0 seconds, got {self.reload_every_s}")
        if self.max_batch_rows < 1 or self.max_wait_ms < 0:
            raise ValueError("max_batch_rows must be >= 1 and max_wait_ms >= 0")

    def auth_token(self) -> str | None:
        """The token from the environment (None without `auth_token_env`).

        Raises:
            ValueError: the variable is named but unset or empty (never serve open by mistake).
        """
        if not self.auth_token_env:
            return None
        token = os.environ.get(self.auth_token_env, "")
        if not token:
            raise ValueError(f"--auth-token-env {self.auth_token_env}: that environment variable is unset or empty")
        return token


def serve(source: BundleSource, config: ServeConfig) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers stop it gracefully: requests in flight finish)."""
    try:
        import uvicorn
    except ImportError:
        raise RuntimeError("the scorer needs the optional extra: pip install 'ctr-pipeline[serve]'") from None
    from flows.serving.app import ApiLimits, build_app
    from flows.serving.batcher import MicroBatcher

    token = config.auth_token()
    holder = ModelHolder()
    reloader = Reloader(source, holder, every_s=config.reload_every_s)
    first = source.wanted()
    if first is None:
        log.warning("no bundle published yet (%s): not ready until one is", source.layout.bundle_latest())  # type: ignore[union-attr]
    elif source.follows_latest:
        reloader.check()  # a refused bundle is logged; the server waits, unready, for the next one
    else:
        holder.swap(source.load(first))  # pinned: a bundle that does not load is an error
    app = build_app(holder, MicroBatcher(max_rows=config.max_batch_rows, max_wait_s=config.max_wait_ms / 1000),
                    limits=ApiLimits(max_body_bytes=config.max_body_bytes, max_lines=config.max_lines),
                    reloader=reloader if source.follows_latest else None, auth_token=token)
    log.info("score-server on http://%s:%d (%s%s)", config.host, config.port,
             f"serving {holder.current.version}" if holder.current else "no model yet",
             ", bearer token required" if token else "")
    uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                                  lifespan="on")).run()
