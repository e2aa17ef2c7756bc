"""`ctrpipe deploy` and `ctrpipe serve` against a real Prefect server on 127.0.0.1, and a real webhook receiver.

Deploy checks what can be refused before it registers anything: without a webhook URL (and no block)
it exits 1 leaving the server as it was (it had registered all three deployments, the cron one too).
An automation of the earlier naming (`ctr-<model>-run-failed`, matching every root) is deleted.
With one it prints its own lines, not Prefect's three tables, and the config's digest.  One model on
two roots gets two pairs of automations, keyed by model and root (not one `ctr-ctr-run-failed`
shared).  `ctrpipe serve` registers the same automations as deploy (it registered none).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import yaml

from flows.config import from_dict
from flows.prefect.alerts import failed_run_automation, missing_run_automation
from flows.prefect.keys import config_digest
from tests.helpers.prefect_server import criteo_config, webhook_receiver
from tests.helpers.prefect_state import automation_names, client_of, deployments, work_pool_names
from tests.helpers.procs import BIN, PrefectServer, processes, start

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun


def _config(path: Path, root: Path, model: str = "ctr") -> tuple[Path, dict]:
    config = criteo_config(root, root.parent / "raw", model_name=model)
    path.write_text(yaml.safe_dump(config))
    return path, config


def _ctrpipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ctrpipe"), *args], env=env, capture_output=True, text=True, timeout=600)


def _state(api: str) -> dict:
    """The server's deployments, automations and work pools, and the digest of the config frozen into ctr-daily."""
    deps = deployments(api)
    daily = deps.get("ctr-daily")
    return {
        "deployments": sorted(deps),
        "automations": automation_names(api),
        "pools": work_pool_names(api),
        "daily_config": config_digest(daily.parameters["config"]) if daily else None,
    }


def _legacy_automation(api: str) -> None:
    """The automation of the model before they were keyed by root (`ctr-<model>-run-failed`, every root's runs)."""
    from prefect.automations import Automation, DoNothing, EventTrigger

    with client_of(api):
        Automation(
            name="ctr-ctr-run-failed", trigger=EventTrigger(expect={"prefect.flow-run.Failed"}), actions=[DoNothing()]
        ).create()


def test_deploy_checks_first_and_serve_registers_the_automations(tmp_path, free_port):
    staging, _ = _config(tmp_path / "staging.yaml", tmp_path / "staging")
    prod, _ = _config(tmp_path / "prod.yaml", tmp_path / "prod")
    served, _ = _config(tmp_path / "served.yaml", tmp_path / "prod", model="gamma")
    with webhook_receiver() as hook, processes() as procs:
        server = PrefectServer(procs, tmp_path, tmp_path / "prefect", port=free_port)
        server.start()
        env = {k: v for k, v in server.env.items() if k != "CTRPIPE_ALERT_WEBHOOK_URL"}
        _legacy_automation(server.api)

        refused = _ctrpipe(["deploy", "--config", str(staging)], env)
        assert refused.returncode == 1 and "no notification block 'ctr-alerts'" in refused.stderr, refused.stderr
        assert _state(server.api) == {
            "deployments": [],
            "automations": ["ctr-ctr-run-failed"],
            "pools": [],
            "daily_config": None,
        }  # nothing registered

        env = {**env, "CTRPIPE_ALERT_WEBHOOK_URL": hook.url}
        for cfg in (staging, prod):
            out = _ctrpipe(["deploy", "--config", str(cfg)], env)
            assert out.returncode == 0, out.stderr + out.stdout
            assert "Successfully created" not in out.stdout and "┃" not in out.stdout, out.stdout  # Prefect's tables
        again = _ctrpipe(["deploy", "--config", str(staging)], env).stdout
        assert f"config {_state(server.api)['daily_config']} is frozen into the deployments" in again, again
        layouts = [from_dict(yaml.safe_load(p.read_text())).layout() for p in (staging, prod)]
        expected = sorted(f(x) for x in layouts for f in (failed_run_automation, missing_run_automation))
        state = _state(server.api)
        assert state["automations"] == expected and len(set(expected)) == 4, state  # the legacy one deleted
        assert state["deployments"] == ["ctr-backfill", "ctr-daily", "ctr-on-demand"] and state["pools"] == [
            "ctr-process"
        ]

        start(procs, [str(BIN / "ctrpipe"), "serve", "--config", str(served)], tmp_path / "serve.log", env=env)
        gamma = from_dict(yaml.safe_load(served.read_text())).layout()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = _state(server.api)
            if failed_run_automation(gamma) in state["automations"] and {
                "gamma-daily",
                "gamma-on-demand",
                "gamma-backfill",
            } <= set(state["deployments"]):
                break  # serve registers the three deployments one after the other
            time.sleep(0.5)
        assert failed_run_automation(gamma) in state["automations"], (tmp_path / "serve.log").read_text()
        assert missing_run_automation(gamma) in state["automations"]
        assert {"gamma-daily", "gamma-on-demand", "gamma-backfill"} <= set(state["deployments"])
