"""`ctrpipe score-server`: load a bundle, then serve `flows.serving.app` on uvicorn until stopped.

Starlette and uvicorn are the optional `serve` extra.  The server binds 127.0.0.1 unless told
otherwise; the bearer token, when there is one, is read from the environment variable the config
names and never logged or stored.  With `latest`, a server started before the first publish
answers `/readyz` with 503 and loads the first bundle the pointer names; a pinned bundle that does
not load stops the server with the reason.

The port is bound before anything else (`bind`), so a port in use is an error at once, before a
bundle is loaded, and the address announced is the one bound (`--port 0`: the port the system chose).

SIGTERM (a pod being stopped) ends it gracefully: uvicorn stops taking connections, the requests in flight are
answered, the batcher stops, then one line "score-server stopped on SIGTERM ..." and exit code 0
(`flows.cli.exit_codes.ExitCode.OK`).  Ctrl-C (SIGINT) stops it the same way and exits 130.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType

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
    access_log: bool = False
    """Log one line per /v1/score request (logger `ctrpipe.serve.access`)."""

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


class ServeError(RuntimeError):
    """The server cannot start (the message says why and what to do)."""


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0: a free port the system picks).

    Raises:
        ServeError: the address is in use, or cannot be bound.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ServeError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds while old connections linger
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ServeError(
                f"--port {port}: {host}:{port} is in use by another process; stop it, or pick another "
                "port (--port 0 picks a free one)"
            ) from None
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def bound_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _Terminated(Exception):
    """SIGTERM arrived: raised by `_on_sigterm` (uvicorn, once stopped gracefully, raises the signal again)."""


def _on_sigterm(sig: int, frame: FrameType | None) -> None:
    raise _Terminated


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    """Within the block, SIGTERM raises `_Terminated` (uvicorn's own handler takes over while it serves, and
    raises the signal again once it has stopped); the handler before it is restored after (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def serve(source: BundleSource, config: ServeConfig) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers stop it gracefully: requests in flight finish); on SIGTERM
    log one line and return (see the module docstring).

    Raises:
        ServeError: the port cannot be bound, or the server did not start.
    """
    try:
        import uvicorn  # noqa: F401 - the optional extra, checked before the port is bound
    except ImportError:
        raise RuntimeError("the scorer needs the optional extra: pip install 'ctr-pipeline[serve]'") from None
    token = config.auth_token()
    sock = bind(config.host, config.port)
    try:
        with _sigterm_stops():
            _run(source, config, sock, token)
    except _Terminated:
        log.info("score-server stopped on SIGTERM after answering the requests in flight")
    finally:
        sock.close()


def _run(source: BundleSource, config: ServeConfig, sock: socket.socket, token: str | None) -> None:
    """Load the first bundle (or wait for one), then serve the app on `sock` until stopped."""
    import uvicorn

    from flows.serving.app import ApiLimits, build_app
    from flows.serving.batcher import MicroBatcher

    holder = ModelHolder()
    reloader = Reloader(source, holder, every_s=config.reload_every_s)
    first = source.wanted()
    if first is None:
        log.warning("no bundle published yet (%s): not ready until one is", source.layout.bundle_latest())  # type: ignore[union-attr]
    elif source.follows_latest:
        reloader.check()  # a refused bundle is logged; the server waits, unready, for the next one
    else:
        holder.swap(source.load(first))  # pinned: a bundle that does not load is an error
    app = build_app(
        holder,
        MicroBatcher(max_rows=config.max_batch_rows, max_wait_s=config.max_wait_ms / 1000),
        limits=ApiLimits(max_body_bytes=config.max_body_bytes, max_lines=config.max_lines),
        reloader=reloader if source.follows_latest else None,
        auth_token=token,
        access_log=config.access_log,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
    log.info(
        "score-server on %s (%s%s)",
        bound_url(sock),
        f"serving {holder.current.version}" if holder.current else "no model yet",
        ", bearer token required" if token else "",
    )
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn's startup failure exits 3, a code `ctrpipe` does not document
        raise ServeError("the server did not start: see the lines above") from None
