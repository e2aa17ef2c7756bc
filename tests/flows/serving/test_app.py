"""The scorer over real HTTP on 127.0.0.1: what a good request gets, and what every bad one gets."""

from __future__ import annotations

import json

import pytest

from tests.helpers.serving import call, criteo_line, score_server, write_tiny_bundle

TOKEN = "tok-3e9a1c77-never-logged"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("app")
    write_tiny_bundle(str(tmp / "bundle"))
    from tests.helpers.procs import free_port

    port = free_port()
    args = ["--bundle", str(tmp / "bundle"), "--max-lines", "100", "--max-body-bytes", "65536",
            "--auth-token-env", "SCORER_TOKEN"]
    with score_server(args, port, tmp / "server.log", env={"SCORER_TOKEN": TOKEN}) as proc:
        yield port, proc, tmp / "server.log"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_lines_are_scored_and_a_malformed_one_gets_null_and_the_ingest_reason(server):
    port, _, _ = server
    lines = [criteo_line(i) for i in range(5)]
    lines.insert(2, "1\tnot-a-number" + criteo_line(0)[criteo_line(0).index("\t", 2):])
    lines.insert(4, criteo_line(9).replace("\t", ","))  # a line of another format
    status, body = call(port, "POST", "/v1/score", {"lines": lines}, headers=AUTH)
    assert status == 200 and body["model_version"] == "v00001"
    assert [s is None for s in body["scores"]] == [False, False, True, False, True, False, False]
    assert all(0 < s < 1 for s in body["scores"] if s is not None)
    assert body["errors"] == [{"index": 2, "reason": "non-numeric integer field: I1='not-a-number'"},
                              {"index": 4, "reason": "wrong field count: 1 fields, expected 14..40"}]
    again = call(port, "POST", "/v1/score", {"lines": lines[:2]}, headers=AUTH)[1]
    assert again["scores"] == body["scores"][:2]  # batching with other requests changes no score


def test_rows_of_named_fields_score_like_their_lines(server):
    port, _, _ = server
    line = criteo_line(3)
    row = dict(zip(("label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]),
                   line.split("\t"), strict=True))
    row = {k: int(v) if k.startswith("I") else v for k, v in row.items() if k != "label"}
    status, body = call(port, "POST", "/v1/score", {"rows": [row, {"C1": "x", "C99": 1}]}, headers=AUTH)
    assert status == 200
    by_line = call(port, "POST", "/v1/score", {"lines": [line]}, headers=AUTH)[1]["scores"][0]
    assert body["scores"][0] == pytest.approx(by_line, abs=1e-9) and body["scores"][1] is None
    assert body["errors"][0]["index"] == 1 and "unknown fields ['C99']" in body["errors"][0]["reason"]


@pytest.mark.parametrize(
    ("kwargs", "status", "message"),
    [
        ({"raw": b'{"lines": [}'}, 400, "invalid JSON"),
        ({"raw": b'{"lines": [NaN]}'}, 400, "invalid JSON"),
        ({"body": ["a"]}, 400, "must be an object"),
        ({"body": {"lines": [], "rows": []}}, 400, "exactly one of"),
        ({"body": {"lines": "one line"}}, 422, "must be a list"),
        ({"body": {"lines": [criteo_line(0), 5]}}, 422, "lines[1] must be a string"),
        ({"body": {"lines": [criteo_line(0)] * 101}}, 413, "101 lines in one request, the limit is 100"),
        ({"raw": b'{"lines": ["' + b"x" * 70000 + b'"]}'}, 413, "over the limit of 65536 bytes"),
        ({"body": {"lines": []}, "headers": {"Content-Type": "text/plain"}}, 415, "application/json"),
        ({"body": {"lines": []}, "headers": {"Authorization": "Bearer wrong"}}, 401, "bearer token"),
    ],
)
def test_a_bad_request_gets_its_4xx_and_the_server_stays_up(server, kwargs, status, message):
    port, proc, _ = server
    headers = {**AUTH, **kwargs.pop("headers", {})}
    got, body = call(port, "POST", "/v1/score", headers=headers, **kwargs)
    assert got == status and message in body["error"], body
    assert proc.poll() is None and call(port, "GET", "/healthz")[0] == 200


def test_a_huge_number_of_lines_within_the_limit_is_scored(server):
    port, _, _ = server
    status, body = call(port, "POST", "/v1/score", {"lines": [criteo_line(i) for i in range(100)]}, headers=AUTH)
    assert status == 200 and len(body["scores"]) == 100 and body["errors"] == []


def test_probes_are_open_model_info_needs_the_token_and_the_token_is_never_logged(server):
    port, _, log = server
    assert call(port, "GET", "/healthz") == (200, {"status": "alive"})
    assert call(port, "GET", "/readyz") == (200, {"status": "ready", "model_version": "v00001"})
    assert call(port, "GET", "/v1/model")[0] == 401
    assert call(port, "POST", "/v1/score", {"lines": [criteo_line(1)]}, headers=AUTH)[0] == 200  # counted below
    status, info = call(port, "GET", "/v1/model", headers=AUTH)
    assert status == 200 and info["model_version"] == "v00001" and info["auc"] == 0.5
    assert info["dates_trained"] == ["2026-01-01"] and info["rows"] > 0 and info["batching"]["requests"] >= 1
    assert call(port, "GET", "/v1/nothing", headers=AUTH)[0] == 404
    assert TOKEN not in log.read_text() and TOKEN not in json.dumps(info)
