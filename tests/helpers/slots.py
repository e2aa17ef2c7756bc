"""A model slot held by another process, which a test can then SIGKILL (flows.node.locks, flows.prefect.slot)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.procs import start

_HOLD = """
import logging, sys, time
from storage.io.layout import Layout
kind, root = sys.argv[1], sys.argv[2]
if kind == "server":
    from flows.prefect.slot import server_slot as slot
else:
    from flows.node.locks import node_slot as slot
with slot(Layout(root, "ctr"), 60, log=logging.getLogger("holder")):
    print("HELD", flush=True)
    time.sleep(3600)
"""


def hold_slot(
    procs: list[subprocess.Popen], kind: str, root: Path | str, log: Path, env: dict | None = None, timeout: float = 120
) -> subprocess.Popen:
    """Start a process (its own process group) that takes the `kind` ("node" or "server") slot of model `ctr` on
    `root` and keeps it; returns once it holds it."""
    proc = start(procs, [sys.executable, "-c", _HOLD, kind, str(root)], log, env=env)
    deadline = time.monotonic() + timeout
    while "HELD" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the slot holder did not take the slot (exit {proc.poll()}):\n{log.read_text()}")
        time.sleep(0.1)
    return proc
