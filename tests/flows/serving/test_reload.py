"""Three published days: a server under load switches to the next day's model and drops no request; a corrupt
bundle is refused; base + deltas rebuild the last day's rows bit for bit; retention and sizes in `models`."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from flows.day.run import run_day
from flows.serving.bundle import MANIFEST, PROGRAM, BundleReader
from flows.serving.tables import chain_table, read_table
from pipeline.generate import generate_days
from storage.io.registry import ModelRegistry
from tests.helpers.cli_here import ctrpipe_here
from tests.helpers.procs import free_port
from tests.helpers.serving import call, cli_args, criteo_line, day_config, score_server

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun
DAYS = ("2026-03-01", "2026-03-02", "2026-03-03")
RELOAD_S = 1.0


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Days 1 and 2 published; day 3 is published by the reload test while a server is under load."""
    tmp = tmp_path_factory.mktemp("reload")
    generate_days(str(tmp / "raw"), 3, 2500, seed=11, start_date=DAYS[0])
    # the network alone: a companion's fit would be most of each day's training (a bundle with a companion, served,
    # evaluated and exported: tests/flows/serving/test_companion.py)
    cfg = day_config(tmp / "root", str(tmp / "raw" / "day_{date}.tsv.gz"), **{"model.companion": "off"})
    for day in DAYS[:2]:
        assert run_day(cfg, day).record.status == "published"
    return tmp, cfg


def _load(port: int, stop: threading.Event, seen: list, failures: list) -> None:
    lines = [criteo_line(i) for i in range(16)]
    while not stop.is_set():
        try:
            status, body = call(port, "POST", "/v1/score", {"lines": lines}, timeout=30)
        except OSError as exc:
            failures.append(repr(exc))
            continue
        if status != 200 or any(s is None for s in body["scores"]):
            failures.append((status, body))
        else:
            seen.append((time.time(), body["model_version"]))


def test_a_server_under_load_switches_to_the_next_published_day_and_refuses_a_corrupt_bundle(published, capfd):
    tmp, cfg = published
    layout, port = cfg.layout(), free_port()
    with score_server(
        [*cli_args(cfg), "--model", "latest", "--reload-every", str(RELOAD_S)], port, tmp / "server.log"
    ) as proc:
        assert call(port, "GET", "/v1/model")[1]["model_version"] == "v00002"
        stop, seen, failures = threading.Event(), [], []
        clients = [threading.Thread(target=_load, args=(port, stop, seen, failures)) for _ in range(3)]
        for c in clients:
            c.start()
        try:
            assert run_day(cfg, DAYS[2]).record.model_version == "v00003"
            pointer_moved = (tmp / "root" / "bundles" / "ctr" / "LATEST").stat().st_mtime
            deadline = time.time() + 60
            while time.time() < deadline and not any(v == "v00003" for _, v in seen):
                time.sleep(0.1)
        finally:
            stop.set()
            for c in clients:
                c.join(timeout=60)
        assert failures == [] and len(seen) > 20
        first_new = min(t for t, v in seen if v == "v00003")
        info = call(port, "GET", "/v1/model")[1]
        assert info["model_version"] == "v00003" and info["switches"] == 1
        assert first_new - pointer_moved <= RELOAD_S + info["loaded_s"] + 3.0

        # a corrupt bundle: refused, logged, and the old version keeps answering
        bad = tmp / "root" / "bundles" / "ctr" / "v00004"
        shutil.copytree(tmp / "root" / "bundles" / "ctr" / "v00003", bad)
        manifest = json.loads((bad / MANIFEST).read_text())
        (bad / MANIFEST).write_text(json.dumps({**manifest, "version": "v00004"}))
        (bad / PROGRAM).write_bytes(b"not a program")
        (tmp / "root" / "bundles" / "ctr" / "LATEST").write_text("v00004\n")
        time.sleep(RELOAD_S * 3 + 1)
        status, body = call(port, "POST", "/v1/score", {"lines": [criteo_line(1)]})
        assert status == 200 and body["model_version"] == "v00003" and proc.poll() is None
        info = call(port, "GET", "/v1/model")[1]
        assert "dense.pt2" in info["refused"]["v00004"] and "corrupt" in info["refused"]["v00004"]
        assert "refused bundle v00004" in (tmp / "server.log").read_text()
        assert call(port, "GET", "/readyz")[0] == 200
        metrics = call(port, "GET", "/metrics")[1]  # the switch and the refusal, as a platform scrapes them
        samples = {
            (s.name, *sorted(s.labels.values())): s.value
            for f in text_string_to_metric_families(metrics)
            for s in f.samples
        }
        assert (
            samples["ctrpipe_model_reloads_total", "ok"] == 1 and samples["ctrpipe_model_reloads_total", "refused"] == 1
        )
        assert samples["ctrpipe_model_info", "ctr", "v00003"] == 1
    (tmp / "root" / "bundles" / "ctr" / "LATEST").write_text("v00003\n")
    shutil.rmtree(bad)
    _check_chain_and_sizes(tmp, cfg, layout, capfd)


def _check_chain_and_sizes(tmp, cfg, layout, capfd):
    """Base of day 1 + deltas of days 2 and 3 == the full export of day 3, bit for bit; sizes and retention."""
    chain = [BundleReader(layout.bundle("v00001"))]
    chain += [BundleReader(layout.bundle_delta(f"v0000{i}", f"v0000{i - 1}")) for i in (2, 3)]
    rebuilt, full = chain_table(chain), read_table(BundleReader(layout.bundle("v00003")))
    assert np.array_equal(rebuilt.keys, full.keys) and np.array_equal(rebuilt.emb, full.emb)
    assert rebuilt.emb.tobytes() == full.emb.tobytes()
    assert all(r.manifest["rows"] < r.manifest["table_rows"] for r in chain[1:])  # deltas hold fewer rows

    def run(*args: str) -> subprocess.CompletedProcess:
        return ctrpipe_here(*args, *cli_args(cfg), tmp=tmp, capfd=capfd)

    out = run("export", "--model", "v00003", "--delta-from", "v00002", "--out", str(tmp / "delta"))
    assert out.returncode == 0, out.stderr
    mine, published = BundleReader(str(tmp / "delta")), chain[-1]
    assert read_table(mine).keys.tolist() == read_table(published).keys.tolist()
    assert mine.manifest["rows_digest"] == published.manifest["rows_digest"]

    out = run("export", "--model", "latest", "--dtype", "float16", "--out", str(tmp / "half"))
    assert out.returncode == 0, out.stderr
    half = BundleReader(str(tmp / "half"))
    emb_bytes = lambda r: r.manifest["files"]["rows/emb.npy"]["bytes"]  # noqa: E731
    assert read_table(half).emb.dtype == np.float16
    assert emb_bytes(half) < 0.6 * emb_bytes(BundleReader(layout.bundle("v00003")))
    change = half.manifest["dtype_auc"]
    assert (
        change["rows"] > 0
        and abs(change["change"]) < 0.01
        and change["float32"] == pytest.approx(ModelRegistry(layout).info("v00003").metrics["auc"], abs=1e-9)
    )

    shown = json.loads(run("models", "show", "v00003", "--json").stdout)
    delta = shown["bundle"]["deltas"][0]
    assert delta["from"] == "v00002" and 0 < delta["bytes"] < shown["bundle"]["full_bytes"]
    assert shown["bytes"] == ModelRegistry(layout).version_bytes("v00003")
    listed = run("models", "list").stdout.splitlines()
    assert len(listed) == 3 and all("bytes=" in line and "bundle=" in line for line in listed)

    # the newest version alone within the window: the one before it is kept as the base of its delta, not for the window
    dry = run("models", "prune", "--dry-run", "--set", "registry.keep_versions=1")
    assert "would delete v00001" in dry.stdout and "keep    v00002  base of the delta of v00003" in dry.stdout
    assert ModelRegistry(layout).versions() == ["v00001", "v00002", "v00003"]
