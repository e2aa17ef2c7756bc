"""For the tests against a real Prefect server (`tests.helpers.procs.PrefectServer` starts it): the run
config of days cut from the Criteo sample, and a real HTTP webhook receiver on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def criteo_config(root: Path, raw: Path, **sections: dict) -> dict:
    """A run config for days cut from the real Criteo sample (`raw/day_D.tsv`): a tiny model without the
    companion (its fit is a large share of a small day's training; these tests are about the orchestration, and
    the demo and tests/flows/serving/test_companion.py run it), one Dask thread; `sections` are merged into the
    config's sections."""
    cfg = {
        "root": str(root),
        "input": {"url": str(raw / "day_{date}.tsv"), "format": "criteo"},
        "dask": {"processes": False, "n_workers": 1},
        "vocab": {"min_count": 2},
        "store": {"embedding_dim": 8, "host_budget_mb": 64},
        "model": {"mlp_dims": [32, 16], "companion": "off"},
        "optim": {"batch_size": 256, "k_steps": 5},
        "publish": {
            "max_auc_drop": 0.05,
            "min_eval_rows": 50,
            "calibration_range": [0.5, 2.0],
        },  # ~330 eval rows after a dozen steps
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
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
