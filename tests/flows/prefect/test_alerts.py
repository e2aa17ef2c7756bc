"""Alerts and many models on one root and one real Prefect server.

The automations a model gets (unit), then, against `prefect server start` on 127.0.0.1 (the session's,
`prefect_api`: the models, their notification block and their automations are named for this test alone) and a
real webhook receiver on 127.0.0.1: two models with different configs on one root deploy side by side
(the second leaves the first's schedule and automations in place; a redeploy duplicates nothing),
both run the same date and publish their own versions from events ingested once; a successful run
sends no notification, a refused run and a failed run one each, naming the model, the date and
the reason.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from prefect.client.schemas.actions import WorkPoolCreate

from flows.prefect.alerts import (
    ALERT_STATES,
    AlertsConfig,
    automations,
    failed_run_automation,
    missing_run_automation,
)
from flows.prefect.keys import model_key
from storage.io.layout import Layout
from tests.helpers.prefect_server import criteo_config, webhook_receiver
from tests.helpers.prefect_state import automation_names, client_of, deployments
from tests.helpers.procs import BIN

DATE = "2026-04-01"
BLOCK = "00000000-0000-0000-0000-000000000001"
HOOK_BLOCK, POOL = "alerts-test-hook", "alerts-test-process"
"""The notification block and the work pool of this test's models: on the session's server, no other test's."""


def test_a_model_gets_a_failed_run_and_a_missing_run_automation(tmp_path):
    layout = Layout(str(tmp_path / "prod"), "m1")
    failed, missing = automations(layout, BLOCK, "dep-id", AlertsConfig())
    assert failed.name == failed_run_automation(layout) == f"{model_key(layout)}-run-failed"
    assert failed.trigger.expect == {f"prefect.flow-run.{s}" for s in ALERT_STATES}
    related = [r.model_dump() for r in failed.trigger.match_related]
    assert {
        "prefect.resource.id": f"prefect.tag.ctr-model:{model_key(layout)}",
        "prefect.resource.role": "tag",
    } in related
    assert "m1" in failed.actions[0].body and "flow_run.state.message" in failed.actions[0].body
    assert str(tmp_path / "prod") in failed.actions[0].body  # which root's run
    assert missing.name == missing_run_automation(layout) and missing.trigger.posture == "Proactive"
    assert missing.trigger.within == dt.timedelta(hours=26)
    assert missing.trigger.match_related.model_dump() == {"prefect.resource.id": "prefect.deployment.dep-id"}


def test_one_model_on_two_roots_gets_two_pairs_of_automations_that_match_apart(tmp_path):
    staging, prod = Layout(str(tmp_path / "staging"), "ctr"), Layout(str(tmp_path / "prod"), "ctr")
    names = {a.name for layout in (staging, prod) for a in automations(layout, BLOCK, "d", AlertsConfig())}
    assert len(names) == 4 and not [n for n in names if n.startswith("ctr-ctr-")]
    tags = [
        {
            r.model_dump().get("prefect.resource.id")
            for r in automations(layout, BLOCK, "d", AlertsConfig())[0].trigger.match_related
        }
        for layout in (staging, prod)
    ]
    assert tags[0] != tags[1]


def test_alert_settings_are_validated():
    with pytest.raises(ValueError, match="alerts.expect_within"):
        AlertsConfig(expect_within=0)


# ---- a real server -------------------------------------------------------------------------------
def _config(path: Path, root: Path, raw: Path, name: str, **sections) -> Path:
    config = criteo_config(root, raw, model_name=name, alerts={"block": HOOK_BLOCK}, **sections)
    path.write_text(yaml.safe_dump(config))
    return path


def _ctrpipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ctrpipe"), *args], env=env, capture_output=True, text=True, timeout=600)


def _schedules(api: str, models: tuple[str, ...]) -> dict[str, list[str]]:
    """Deployment name -> its cron schedules, on the server at `api`, of the deployments of `models`."""
    return {
        name: [str(s.schedule.cron) for s in d.schedules]
        for name, d in deployments(api).items()
        if name.startswith(tuple(f"{m}-" for m in models))
    }


@pytest.mark.slow
@pytest.mark.server  # the session's Prefect server and a webhook receiver
def test_two_models_share_a_root_and_a_server_and_alerts_reach_a_webhook(shared_data, tmp_path, prefect_api):
    raw, root = tmp_path / "raw", tmp_path / "root"
    raw.mkdir()
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_bytes().splitlines(keepends=True)
    (raw / f"day_{DATE}.tsv").write_bytes(b"".join(lines[:3333]))
    a = _config(tmp_path / "a.yaml", root, raw, "alpha")
    b = _config(tmp_path / "b.yaml", root, raw, "beta", vocab={"min_count": 3}, model={"mlp_dims": [16]})
    with webhook_receiver() as hook:
        env = {
            **os.environ,
            "PREFECT_API_URL": prefect_api,
            "PREFECT_LOGGING_LEVEL": "INFO",
            "CTRPIPE_ALERT_WEBHOOK_URL": hook.url,
        }
        with client_of(prefect_api) as client:  # deploy creates only its default pool itself
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"), overwrite=True)
        for cfg in (a, b, a):  # the second model, then a redeploy of the first
            out = _ctrpipe(["deploy", "--pool", POOL, "--config", str(cfg)], env)
            assert out.returncode == 0, out.stderr + out.stdout
        assert _schedules(prefect_api, ("alpha", "beta")) == {
            "alpha-daily": ["0 2 * * *"],
            "alpha-on-demand": [],
            "alpha-backfill": [],
            "beta-daily": ["0 2 * * *"],
            "beta-on-demand": [],
            "beta-backfill": [],
        }
        layouts = [Layout(str(root), m) for m in ("alpha", "beta")]
        keys = tuple(model_key(x) for x in layouts)
        assert [n for n in automation_names(prefect_api) if n.startswith(keys)] == sorted(
            [failed_run_automation(x) for x in layouts] + [missing_run_automation(x) for x in layouts]
        )

        # both models run the same date on the same input: events are ingested once
        assert _ctrpipe(["run", "--date", DATE, "--config", str(a)], env).returncode == 0
        events = json.loads((root / "events" / f"date={DATE}" / "_SUCCESS.json").read_text())
        out = _ctrpipe(["run", "--date", DATE, "--config", str(b)], env)
        assert out.returncode == 0, out.stderr
        assert (
            json.loads((root / "events" / f"date={DATE}" / "_SUCCESS.json").read_text())["run_id"] == events["run_id"]
        )
        for model in ("alpha", "beta"):
            record = json.loads((root / "runs" / model / f"date={DATE}" / "metrics.json").read_text())
            assert record["status"] == "published" and record["model_version"] == "v00001", record
            assert (root / "models" / model / "LATEST").read_text().strip() == "v00001"
        assert len(list((root / "vocab").iterdir())) == 2  # the vocab configs differ: one each
        assert hook.bodies == []  # success is silent (a late notification of it is a third body, checked below)

        # a refused run and a failed run (at once: other dates, nothing shared): one notification each
        with ThreadPoolExecutor(2) as pool:
            refused, failed = pool.map(
                lambda args: _ctrpipe(args, env),
                [
                    ["run", "--date", DATE, "--force", "--config", str(a), "--set", "publish.min_auc=0.99"],
                    # input.wait_s: past the preflight, which refuses a missing file before any flow run (no alert)
                    ["run", "--date", "2026-04-09", "--config", str(a), "--set", "input.wait_s=1"],
                ],
            )
        assert refused.returncode == 2, refused.stderr
        assert failed.returncode == 1, failed.stderr
        got = hook.wait_for(2, timeout=90)
        time.sleep(5)
        assert len(hook.bodies) == 2, hook.bodies
    texts = sorted(b["body"] for b in got)
    assert all("model alpha" in t for t in texts), texts
    refusal = next(t for t in texts if "PublishRefused" in t)
    assert DATE in refusal and "publish.min_auc=0.99" in refusal
    failure = next(t for t in texts if "PublishRefused" not in t)
    assert "2026-04-09" in failure and "no input for 2026-04-09" in failure and "Failed" in failure
    assert (root / "models" / "alpha" / "LATEST").read_text().strip() == "v00001"
