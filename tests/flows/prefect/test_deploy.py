"""Production orchestration against a real Prefect server on 127.0.0.1.

On the session's server (`prefect_api`, a `prefect server start`; the model and its work pool are named for this
test alone, so no other test's deployment or worker meets them), the test deploys with `ctrpipe deploy` (process
work pool), starts a worker, runs the `on-demand` deployment for one day of the
real Criteo sample and then the `backfill` deployment over that day and the next:
it runs only the next day.  (That a backfill stops at a broken day, leaving the later
ones unstarted and its flow run failed, and that its rerun runs the failed and later
days: the same flow in tests/flows/prefect/test_daily.py; a deployment's run is that
flow's run.)  Everything it started is stopped at the end, even on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from prefect.client.schemas.actions import WorkPoolCreate

from tests.helpers.chaos import write_days
from tests.helpers.prefect_server import criteo_config
from tests.helpers.prefect_state import client_of
from tests.helpers.procs import BIN, processes, start

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun

DAYS = ["2026-04-01", "2026-04-02"]
MODEL, POOL = "deployed", "deployed-process"
"""This test's model and work pool: names no other test's deployment or worker on the session's server uses."""


def _run(cmd: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _record(root: Path, date: str) -> dict | None:
    p = root / "runs" / MODEL / f"date={date}" / "metrics.json"
    return json.loads(p.read_text()) if p.exists() else None


def test_deployments_on_a_real_server(shared_data, tmp_path, prefect_api):
    root, raw = tmp_path / "root", tmp_path / "raw"
    write_days(shared_data / "criteo" / "train_head_10k.tsv", raw, DAYS, bad_lines=b"")
    cfg_file = tmp_path / "config.yaml"
    cfg_file.write_text(yaml.safe_dump(criteo_config(root, raw, model_name=MODEL)))
    with client_of(prefect_api) as client:  # deploy creates only its default pool, ctr-process, itself
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
    with processes() as procs:
        client_env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_LOGGING_LEVEL": "INFO"}

        out = _run(
            [str(BIN / "ctrpipe"), "deploy", "--pool", POOL, "--config", str(cfg_file), "--no-alerts"],
            client_env,
        )
        assert out.returncode == 0, out.stderr + out.stdout
        assert f"deployed {MODEL}-daily" in out.stdout and f"deployed {MODEL}-on-demand" in out.stdout
        assert "process work pool" not in out.stdout + out.stderr  # Prefect's advice to `.serve` instead: not ours

        # the worker asks for due runs every second (Prefect's default, every 10 s, delays each run by up to 10 s)
        start(
            procs,
            [str(BIN / "prefect"), "worker", "start", "--pool", POOL, "--type", "process"],
            tmp_path / "worker.log",
            env={**client_env, "PREFECT_WORKER_QUERY_SECONDS": "1"},
        )

        run = _run(
            [
                str(BIN / "prefect"),
                "deployment",
                "run",
                f"daily-retrain/{MODEL}-on-demand",
                "--param",
                f"date={DAYS[0]}",
                "--watch",
                "--watch-timeout",
                "420",
            ],
            client_env,
            timeout=480,
        )
        assert "Completed" in run.stdout, run.stdout + run.stderr
        rec = _record(root, DAYS[0])
        assert rec and rec["status"] == "published" and rec["model_version"] == "v00001"
        assert (root / "models" / MODEL / "LATEST").read_text().strip() == "v00001"
        assert rec["auc"] > 0.6

        # a backfill over both days: only the second one runs
        day1_mtime = (root / "runs" / MODEL / f"date={DAYS[0]}" / "metrics.json").stat().st_mtime
        params = json.dumps({"start": DAYS[0], "end": DAYS[1]})
        run = _run(
            [
                str(BIN / "prefect"),
                "deployment",
                "run",
                f"backfill/{MODEL}-backfill",
                "--params",
                params,
                "--watch",
                "--watch-timeout",
                "420",
            ],
            client_env,
            timeout=480,
        )
        assert "Completed" in run.stdout, run.stdout + run.stderr
        assert (root / "runs" / MODEL / f"date={DAYS[0]}" / "metrics.json").stat().st_mtime == day1_mtime
        versions = [_record(root, d)["model_version"] for d in DAYS]
        assert versions == ["v00001", "v00002"]
        lineage = json.loads((root / "models" / MODEL / "v00002" / "lineage.json").read_text())
        assert lineage["parent_version"] == "v00001"
    assert all(p.poll() is not None for p in procs)
