"""`ctrpipe deploy` and `ctrpipe serve` against a real Prefect server on 127.0.0.1, and a real webhook receiver.

Deploy checks what can be refused before it registers anything: without a webhook URL (and no block)
it exits 1 leaving the server as it was (it had registered all three deployments, the cron one too).
An automation of the earlier naming (`ctr-<model>-run-failed`, matching every root) is deleted.
With one it prints its own lines, not Prefect's three tables, and the config's digest.  One model on
two roots gets two pairs of automations, keyed by model and root (not one `ctr-ctr-run-failed`
shared).  `ctrpipe serve` registers the same automations as deploy (it registered none).

The server is the session's (`prefect_api`): the models and their notification block are named for this test
alone, no other test deploys to the default work pool there, and what it reads of the server is theirs (`_state`).
"""

from __future__ import annotations

import os
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
from tests.helpers.procs import BIN, processes, start

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun

MODEL, SERVED, HOOK_BLOCK = "checked", "gamma", "checked-alerts"
POOL = "ctr-process"
"""Deploy's default work pool, which it creates: no other test deploys to it on the session's server."""


def _config(path: Path, root: Path, model: str = MODEL) -> tuple[Path, dict]:
    config = criteo_config(root, root.parent / "raw", model_name=model, alerts={"block": HOOK_BLOCK})
    path.write_text(yaml.safe_dump(config))
    return path, config


def _ctrpipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ctrpipe"), *args], env=env, capture_output=True, text=True, timeout=600)


def _state(api: str) -> dict:
    """The server's deployments, automations and work pools of this test's models, and the digest of the config
    frozen into their daily deployment."""
    mine = (f"{MODEL}-", f"{SERVED}-", f"ctr-{MODEL}-")
    deps = {name: d for name, d in deployments(api).items() if name.startswith(mine)}
    daily = deps.get(f"{MODEL}-daily")
    return {
        "deployments": sorted(deps),
        "automations": [name for name in automation_names(api) if name.startswith(mine)],
        "pools": [name for name in work_pool_names(api) if name == POOL],
        "daily_config": config_digest(daily.parameters["config"]) if daily else None,
    }


def _legacy_automation(api: str) -> None:
    """The automation of the model before they were keyed by root (`ctr-<model>-run-failed`, every root's runs)."""
    from prefect.automations import Automation, DoNothing, EventTrigger

    with client_of(api):
        Automation(
            name=f"ctr-{MODEL}-run-failed",
            trigger=EventTrigger(expect={"prefect.flow-run.Failed"}),
            actions=[DoNothing()],
        ).create()


def test_deploy_checks_first_and_serve_registers_the_automations(tmp_path, prefect_api):
    staging, _ = _config(tmp_path / "staging.yaml", tmp_path / "staging")
    prod, _ = _config(tmp_path / "prod.yaml", tmp_path / "prod")
    served, _ = _config(tmp_path / "served.yaml", tmp_path / "prod", model=SERVED)
    with webhook_receiver() as hook, processes() as procs:
        env = {k: v for k, v in os.environ.items() if k != "CTRPIPE_ALERT_WEBHOOK_URL"}
        env["PREFECT_API_URL"] = prefect_api
        _legacy_automation(prefect_api)

        refused = _ctrpipe(["deploy", "--config", str(staging)], env)
        assert refused.returncode == 1 and f"no notification block '{HOOK_BLOCK}'" in refused.stderr, refused.stderr
        assert _state(prefect_api) == {
            "deployments": [],
            "automations": [f"ctr-{MODEL}-run-failed"],
            "pools": [],
            "daily_config": None,
        }  # nothing registered

        env = {**env, "CTRPIPE_ALERT_WEBHOOK_URL": hook.url}
        for cfg in (staging, prod):
            out = _ctrpipe(["deploy", "--config", str(cfg)], env)
            assert out.returncode == 0, out.stderr + out.stdout
            assert "Successfully created" not in out.stdout and "┃" not in out.stdout, out.stdout  # Prefect's tables
        again = _ctrpipe(["deploy", "--config", str(staging)], env).stdout
        assert f"config {_state(prefect_api)['daily_config']} is frozen into the deployments" in again, again
        layouts = [from_dict(yaml.safe_load(p.read_text())).layout() for p in (staging, prod)]
        expected = sorted(f(x) for x in layouts for f in (failed_run_automation, missing_run_automation))
        state = _state(prefect_api)
        assert state["automations"] == expected and len(set(expected)) == 4, state  # the legacy one deleted
        assert state["deployments"] == [f"{MODEL}-{d}" for d in ("backfill", "daily", "on-demand")], state
        assert state["pools"] == [POOL], state

        start(procs, [str(BIN / "ctrpipe"), "serve", "--config", str(served)], tmp_path / "serve.log", env=env)
        gamma = from_dict(yaml.safe_load(served.read_text())).layout()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            state = _state(prefect_api)
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
