"""The server's settings and start: validated options, help with defaults, the port bound before it is announced."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time

import pytest

from flows.cli.exit_codes import ExitCode
from flows.serving.server import ServeConfig
from tests.helpers.procs import REPO, processes, start
from tests.helpers.serving import call, criteo_line, wait_ready, write_tiny_bundle


def test_the_token_comes_from_the_named_variable_and_an_empty_one_is_an_error(monkeypatch):
    assert ServeConfig().auth_token() is None and ServeConfig().host == "127.0.0.1"
    monkeypatch.setenv("SCORER_T", "abc")
    assert ServeConfig(auth_token_env="SCORER_T").auth_token() == "abc"
    monkeypatch.setenv("SCORER_T", "")
    with pytest.raises(ValueError, match="SCORER_T: that environment variable is unset or empty"):
        ServeConfig(auth_token_env="SCORER_T").auth_token()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"port": 70000}, "--port"), ({"reload_every_s": 0}, "--reload-every"), ({"max_batch_rows": 0}, "max_batch_rows")],
)
def test_bad_settings_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServeConfig(**kwargs)


def test_help_shows_every_default(capsys):
    from flows.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["score-server", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help to the terminal
    assert exited.value.code == 0
    for default in (
        "(default: latest)",
        "(default: 127.0.0.1",
        "(default: 8000)",
        "(default: 30.0)",
        "(default: 10000)",
        "(default: 8388608)",
        "(default: 4096)",
        "(default: 0.0",
        "(default: off)",
    ):
        assert default in text, default


@pytest.mark.server  # `ctrpipe score-server`
def test_port_0_announces_the_port_bound_and_the_access_log_shows_each_request(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    log = tmp_path / "server.log"
    with processes() as procs:
        proc = start(
            procs,
            [
                sys.executable,
                "-m",
                "flows.cli.main",
                "score-server",
                "--bundle",
                str(tmp_path / "b"),
                "--port",
                "0",
                "--access-log",
            ],
            log,
        )
        deadline = time.monotonic() + 120
        while not (found := re.search(r"score-server on http://127\.0\.0\.1:(\d+) ", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        port = int(found.group(1))
        assert port != 0
        wait_ready(port, proc)
        status, body = call(port, "POST", "/v1/score", {"lines": [criteo_line(1), "x"]})
        assert status == 200 and body["model_version"] == "v00001"
        assert call(port, "POST", "/v1/score", {"lines": "x"})[0] == 422
        deadline = time.monotonic() + 10
        while log.read_text().count('"POST /v1/score"') < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
    text = log.read_text()
    assert re.search(r'127\.0\.0\.1 "POST /v1/score" 200 2 entries [0-9.]+ms v00001', text), text
    assert re.search(r'"POST /v1/score" 422 0 entries', text), text


@pytest.mark.server  # a listening socket holds the port
def test_a_port_in_use_fails_before_serving_with_a_documented_exit_code(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows.cli.main",
                "score-server",
                "--bundle",
                str(tmp_path / "b"),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
        )
    assert out.returncode == ExitCode.FAILED and out.returncode in {int(c) for c in ExitCode}, out.stderr
    assert f"--port {port}: 127.0.0.1:{port} is in use by another process" in out.stderr
    assert "score-server on" not in out.stdout + out.stderr  # nothing announced: it never served


@pytest.mark.server  # `ctrpipe score-server`
def test_sigterm_answers_the_request_in_flight_then_ends_with_one_line_and_exit_code_0(tmp_path):
    import signal
    import threading

    from tests.helpers.procs import free_port
    from tests.helpers.serving import score_server

    write_tiny_bundle(str(tmp_path / "b"))
    port, log = free_port(), tmp_path / "server.log"
    # a batch waits 2.5 s for company: the request below is in flight when SIGTERM comes
    with score_server(["--bundle", str(tmp_path / "b"), "--max-wait-ms", "2500"], port, log) as proc:
        answer: list = []
        client = threading.Thread(
            target=lambda: answer.append(call(port, "POST", "/v1/score", {"lines": [criteo_line(1)]}))
        )
        client.start()
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        client.join(timeout=60)
        assert proc.wait(timeout=60) == ExitCode.OK == 0
    assert answer and answer[0][0] == 200 and answer[0][1]["scores"][0] is not None
    said = [line for line in log.read_text().splitlines() if "SIGTERM" in line]
    assert len(said) == 1 and "score-server stopped on SIGTERM after answering the requests in flight" in said[0]
