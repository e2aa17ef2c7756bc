"""A real `prefect server start` on 127.0.0.1 and a real HTTP webhook receiver, for orchestration tests.

Every process is started in its own session and stopped at the end, even on failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BIN = Path(sys.executable).parent


class Procs:
    """Background processes, each in its own session, all stopped at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.procs):
            for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):  # a worker ignores the first SIGTERM
                if p.poll() is not None:
                    break
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    continue


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"prefect server at {url} not healthy after {timeout}s")


def server_env(tmp_path: Path) -> dict[str, str]:
    """The environment of the server and its clients: their own PREFECT_HOME, no analytics."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_LOGGING_LEVEL": "INFO"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    return env


def start_server(procs: Procs, env: dict[str, str], port: int) -> dict[str, str]:
    """Start `prefect server start` on 127.0.0.1:`port`; returns the clients' environment (PREFECT_API_URL)."""
    api = f"http://127.0.0.1:{port}/api"
    server = procs.start("server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                    "--port", str(port)], env)  # fmt: skip
    wait_healthy(api, server)
    return {**env, "PREFECT_API_URL": api}


def criteo_config(root: Path, raw: Path, **sections: dict) -> dict:
    """A run config for days cut from the real Criteo sample (`raw/day_D.tsv`): a tiny model, one Dask thread;
    `sections` are merged into the config's sections."""
    cfg = {
        "root": str(root),
        "input": {"url": str(raw / "day_{date}.tsv"), "format": "criteo"},
        "dask": {"processes": False, "n_workers": 1},
        "vocab": {"min_count": 2},
        "store": {"embedding_dim": 8, "host_budget_mb": 64},
        "model": {"mlp_dims": [32, 16]},
        "optim": {"batch_size": 256, "k_steps": 5},
        "publish": {"max_auc_drop": 0.05, "min_eval_rows": 50,
                    "calibration_range": [0.5, 2.0]},  # ~330 eval rows after a dozen steps
    }  # fmt: skip
    for key, value in sections.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    return cfg


class Receiver:
    """The JSON bodies POSTed to a webhook, in arrival order."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.bodies: list[dict] = []
        self._lock = threading.Lock()

    def add(self, body: dict) -> None:
        with self._lock:
            self.bodies.append(body)

    def wait_for(self, n: int, timeout: float) -> list[dict]:
        """The bodies once at least `n` arrived (or all there are after `timeout`)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(self.bodies) < n:
            time.sleep(0.5)
        with self._lock:
            return list(self.bodies)


@contextmanager
def webhook_receiver() -> Iterator[Receiver]:
    """A real HTTP server on 127.0.0.1 recording every POSTed JSON body."""
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            holder[0].add(json.loads(body or b"{}"))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()
