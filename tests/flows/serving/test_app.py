"""The scorer over real HTTP on 127.0.0.1: what a good request gets, and what every bad one gets."""

from __future__ import annotations

import json

import pytest

from tests.helpers.serving import call, criteo_line, score_server, write_tiny_bundle

pytestmark = pytest.mark.server  # one `ctrpipe score-server` for the module

TOKEN = "tok-3e9a1c77-never-logged"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("app")
    write_tiny_bundle(str(tmp / "bundle"))
    from tests.helpers.procs import free_port

    port = free_port()
    args = [
        "--bundle",
        str(tmp / "bundle"),
        "--max-lines",
        "100",
        "--max-body-bytes",
        "65536",
        "--auth-token-env",
        "SCORER_TOKEN",
    ]
    with score_server(args, port, tmp / "server.log", env={"SCORER_TOKEN": TOKEN}) as proc:
        yield port, proc, tmp / "server.log"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_lines_are_scored_and_a_malformed_one_gets_null_and_the_ingest_reason(server):
    port, _, _ = server
    lines = [criteo_line(i) for i in range(5)]
    lines.insert(2, "1\tnot-a-number" + criteo_line(0)[criteo_line(0).index("\t", 2) :])
    lines.insert(4, criteo_line(9).replace("\t", ","))  # a line of another format
    status, body = call(port, "POST", "/v1/score", {"lines": lines}, headers=AUTH)
    assert status == 200 and body["model_version"] == "v00001"
    assert [s is None for s in body["scores"]] == [False, False, True, False, True, False, False]
    assert all(0 < s < 1 for s in body["scores"] if s is not None)
    assert body["errors"] == [
        {"index": 2, "reason": "non-numeric integer field: I1='not-a-number'"},
        {
            "index": 4,
            "reason": "wrong field count: 1 fields, expected 14..40 with the label column 'label' or 39 without it",
        },
    ]
    again = call(port, "POST", "/v1/score", {"lines": lines[:2]}, headers=AUTH)[1]
    assert again["scores"] == body["scores"][:2]  # batching with other requests changes no score


def test_rows_of_named_fields_score_like_their_lines(server):
    port, _, _ = server
    line = criteo_line(3)
    row = dict(
        zip(
            ("label", *[f"I{i}" for i in range(1, 14)], *[f"C{i}" for i in range(1, 27)]), line.split("\t"), strict=True
        )
    )
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


def test_features_only_lines_of_a_real_request_log_score_like_the_same_lines_with_a_label(server, shared_data):
    port, _, _ = server
    features = (shared_data / "criteo" / "test_unlabelled_10k.tsv").read_text().splitlines()[:20]
    assert {line.count("\t") + 1 for line in features} == {39}  # a request-time log: no label column
    status, body = call(port, "POST", "/v1/score", {"lines": features, "labelled": False}, headers=AUTH)
    assert status == 200 and body["errors"] == [] and None not in body["scores"]
    for label in ("0", "1"):
        replay = call(port, "POST", "/v1/score", {"lines": [f"{label}\t{line}" for line in features]}, headers=AUTH)[1]
        assert replay["errors"] == [] and replay["scores"] == pytest.approx(body["scores"], abs=1e-9)
    header = "\t".join(["I" + str(i) for i in range(1, 14)] + ["C" + str(j) for j in range(1, 27)])
    csv_body = "\n".join(line.replace("\t", ",") for line in [header, *features]).encode()
    named = call(port, "POST", "/v1/score", raw=csv_body, headers={**AUTH, "Content-Type": "text/csv"})[1]
    assert named["errors"] == [] and named["scores"] == pytest.approx(body["scores"], abs=1e-9)  # a CSV header
    unsaid = call(port, "POST", "/v1/score", {"lines": features}, headers=AUTH)[1]  # 39: labelled and cut, or not?
    assert unsaid["scores"] == [None] * 20 and unsaid["errors"][0]["reason"].startswith("ambiguous field count: 39")


def test_a_line_of_a_wrong_field_count_is_refused_naming_both_counts_and_the_others_are_scored(server):
    port, _, _ = server
    features = criteo_line(1).split("\t", 1)[1]
    lines = [criteo_line(1), features + "\tone-too-many\tand-another", criteo_line(2)]
    status, body = call(port, "POST", "/v1/score", {"lines": lines}, headers=AUTH)
    assert status == 200 and [s is None for s in body["scores"]] == [False, True, False]
    assert body["errors"] == [
        {
            "index": 1,
            "reason": "wrong field count: 41 fields, expected 14..40 with the label column 'label' or 39 without it",
        }
    ]
    status, body = call(port, "POST", "/v1/score", {"lines": [criteo_line(2)], "labelled": False}, headers=AUTH)
    assert (
        status == 200
        and body["scores"] == [None]
        and '(the request says "labelled": false)' in body["errors"][0]["reason"]
    )
    status, body = call(port, "POST", "/v1/score", {"rows": [], "labelled": True}, headers=AUTH)
    assert status == 422 and '"labelled" goes with "lines"' in body["error"]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = call(port, "GET", "/metrics")  # open like the probes: no token
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_count_requests_rows_errors_and_latency_in_the_prometheus_format(server):
    port, _, _ = server
    before = _scrape(port)
    lines = [criteo_line(i) for i in range(4)] + ["2" + criteo_line(5)[1:]]  # the last: a bad label
    assert call(port, "POST", "/v1/score", {"lines": lines}, headers=AUTH)[0] == 200
    assert call(port, "POST", "/v1/score", {"lines": []}, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert call(port, "POST", "/v1/score", raw=b"{", headers=AUTH)[0] == 400
    after = _scrape(port)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("ctrpipe_score_requests_total", code="200") == 1
    assert (
        delta("ctrpipe_score_requests_total", code="401") == 1
        and delta("ctrpipe_score_requests_total", code="400") == 1
    )
    assert delta("ctrpipe_score_rows_total", outcome="scored") == 4
    assert delta("ctrpipe_score_rows_total", outcome="refused") == 1
    assert delta("ctrpipe_score_refused_total", reason="bad label") == 1
    assert delta("ctrpipe_score_request_errors_total", reason="unauthorized") == 1
    assert delta("ctrpipe_score_request_errors_total", reason="bad_request") == 1
    assert delta("ctrpipe_score_latency_seconds_count") == 3
    assert (
        delta("ctrpipe_score_latency_seconds_bucket", le="+Inf") == 3 and delta("ctrpipe_score_latency_seconds_sum") > 0
    )
    assert delta("ctrpipe_score_batches_total") == 1 and delta("ctrpipe_score_stage_seconds_total", stage="forward") > 0
    assert after[("ctrpipe_model_info", (("model", "ctr"), ("version", "v00001")))] == 1
    assert 0 <= after[("ctrpipe_model_age_seconds", ())] < 3600
    assert after[("ctrpipe_model_reloads_total", (("outcome", "ok"),))] == 0
    assert after[("ctrpipe_model_reloads_total", (("outcome", "refused"),))] == 0


def test_the_server_log_carries_no_torch_warning_after_scoring_many_rows(server):
    port, _, log = server
    status, body = call(port, "POST", "/v1/score", {"lines": [criteo_line(i) for i in range(30)]}, headers=AUTH)
    assert status == 200 and None not in body["scores"]
    text = log.read_text()
    assert "score-server on http://127.0.0.1:" in text  # the log is the one the server writes
    assert "non-contiguous" not in text and "Warning" not in text, text[-2000:]
