"""Starting and always stopping real server processes (dask scheduler/workers, moto_server, prefect server) in tests."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{proc.args} did not listen on port {port} within {timeout}s")


@contextmanager
def processes() -> Iterator[list[subprocess.Popen]]:
    """A list to append started processes to; each is stopped (TERM, then KILL) on exit, even on failure."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)


def start(procs: list[subprocess.Popen], args: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start `args` in its own process group (so it can be stopped with its children), output to `log`."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    with open(log, "wb") as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=full_env, start_new_session=True)
    procs.append(p)
    return p


@contextmanager
def moto_s3(log_dir: Path, bucket: str = "ctr") -> Iterator[dict]:
    """A real moto S3 server on a free port, stopped on exit; yields fsspec storage options, with `bucket` made.

    The caller sets AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_DEFAULT_REGION (any values; `AWS_ENV`).
    """
    import s3fs

    port = free_port()
    with processes() as procs:
        server = start(procs, [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], log_dir / "moto.log")
        wait_port(port, server)
        options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}, "skip_instance_cache": True}
        s3fs.S3FileSystem(**options).mkdir(bucket)
        yield options


AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
"""Credentials moto accepts (any values); set them before starting a client of `moto_s3`."""


PREFECT_SERVER_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # leases survive a restart of the server (flows.prefect.slot)
    "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
}


def _migrated_database() -> Path:
    """Where this test process keeps a copy of a Prefect database as a server left it once started (migrated)."""
    return Path(tempfile.gettempdir()) / "prefect-migrated.db"


class PrefectServer:
    """A real `prefect server start` on 127.0.0.1 with its own PREFECT_HOME; stop it and start it again on its port.

    `env` is the environment of its clients (PREFECT_API_URL set).  The first server of a fresh home spends
    about half of its start (seconds) creating and migrating its SQLite database: the first server of a test
    process does, and a copy of its database as it was once healthy (nothing of a test's in it yet) is the
    starting database of every later fresh home in this process.
    """

    def __init__(self, procs: list[subprocess.Popen], log_dir: Path, home: Path, port: int | None = None) -> None:
        self.procs, self.log_dir, self.port = procs, log_dir, port or free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        base = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        self.server_env = {**base, **PREFECT_SERVER_ENV, "PREFECT_HOME": str(home)}
        self.database = home / "prefect.db"
        if _migrated_database().exists() and not self.database.exists():
            home.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_migrated_database(), self.database)
        self.env = {**self.server_env, "PREFECT_API_URL": self.api}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 120) -> None:
        self.starts += 1
        self.proc = start(
            self.procs,
            [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            self.log_dir / f"prefect-server-{self.starts}.log",
            env=self.server_env,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}; see {self.log_dir}")
            try:
                with urllib.request.urlopen(f"{self.api}/health", timeout=2) as r:  # noqa: S310 - http://127.0.0.1
                    if r.status == 200:
                        self._keep_migrated_database()
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"prefect server at {self.api} not healthy after {timeout}s")

    def _keep_migrated_database(self) -> None:
        if _migrated_database().exists() or self.starts > 1:
            return
        part = _migrated_database().with_suffix(f".{os.getpid()}.part")  # the two test workers share TMPDIR
        src, dst = sqlite3.connect(self.database), sqlite3.connect(part)
        try:
            src.backup(dst)  # a consistent copy while the server runs
        finally:
            src.close()
            dst.close()
        part.rename(_migrated_database())

    def kill(self) -> None:
        """SIGKILL the server and everything it started (as a crashed or preempted host would)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


RUN_DIR_ENV = "CTRPIPE_TESTS_RUN_DIR"
"""The test run's folder, which its xdist workers share (set by the first process of the run, `tests/conftest.py`)."""


def once(run_dir: Path, name: str, what: str, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The record `<name>.json` in the run's folder, which its xdist workers share: written from `make()` by the
    first process that asks, under the lock `<name>.lock`, and read by the others."""
    from flows.node.locks import file_lock

    record = run_dir / f"{name}.json"
    log = logging.getLogger(f"tests.{name}")
    with file_lock(str(run_dir / f"{name}.lock"), what=what, timeout_s=300, log=log):  # a server's start: ~20 s
        if not record.exists():
            record.write_text(json.dumps(make()))
        return dict(json.loads(record.read_text()))


def shared_server(run_dir: Path) -> str:
    """The API URL of the run's one `prefect server start` (`prefect_api`): the first process that asks starts it
    (`once`).  None of them stops it (one worker may finish while the other still uses it): the run's first process
    does, once every worker is done (`stop_shared_server`)."""

    def make() -> dict[str, Any]:
        folder = run_dir / "prefect-session"
        folder.mkdir(exist_ok=True)
        server = PrefectServer([], folder, folder / "home")  # a list no `processes()` stops
        server.start()
        assert server.proc is not None  # noqa: S101 - started above
        return {"api": server.api, "pgid": server.proc.pid}

    return str(once(run_dir, "prefect-server", "the test run's Prefect server", make)["api"])


def stop_shared_server(run_dir: Path, timeout: float = 10.0) -> None:
    """Stop the run's shared server and everything it started, if one was started: TERM, and KILL after `timeout`.
    The server is this process's child when this process started it (reaped here); else it is a worker's, or the
    slot scenario's (`tests.helpers.slot_scenario`), and that process is gone by now."""
    record = run_dir / "prefect-server.json"
    if not record.exists():
        return
    pid = json.loads(record.read_text())["pgid"]  # the leader of its own process group (`start`)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                return
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if exited(pid):
                with suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)  # anything it started and left behind
                return
            time.sleep(0.2)


def exited(pid: int) -> bool:
    """No such process, or a zombie nobody has reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
