"""What a model's things on a shared Prefect server are named by: the model and its root, readably."""

from __future__ import annotations

import logging
import os

import yaml

from flows.config import from_dict
from flows.prefect.keys import config_digest, model_key, run_tags
from flows.presets import demo
from storage.io.layout import Layout
from tests.helpers.references import REPO


def test_one_model_on_two_roots_gets_two_short_readable_keys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    staging, prod = Layout(str(tmp_path / "staging"), "ctr"), Layout(str(tmp_path / "prod"), "ctr")
    assert model_key(staging) != model_key(prod)
    assert model_key(staging).startswith("ctr-") and len(model_key(staging)) == len("ctr-") + 8
    assert model_key(Layout("./staging", "ctr")) == model_key(staging)  # a root by its absolute path
    assert run_tags(staging) == ["model:ctr", f"ctr-model:{model_key(staging)}"]


def test_the_config_digest_changes_with_any_value():
    a = demo("/data/a").to_dict()
    assert config_digest(a) == config_digest(demo("/data/a").to_dict()) and len(config_digest(a)) == 12
    assert config_digest(a) != config_digest(demo("/data/b").to_dict())


def test_the_deployments_of_infra_prefect_yaml_carry_the_tags_their_automations_match():
    spec = yaml.safe_load((REPO / "infra" / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        layout = from_dict(deployment["parameters"]["config"]).layout()
        assert set(run_tags(layout)) <= set(deployment["tags"]), deployment["name"]


def test_a_worker_run_without_the_ctrpipe_console_keeps_dask_at_warning(monkeypatch):
    from flows.prefect.daily import quiet_dask

    monkeypatch.setenv("DASK_LOGGING__DISTRIBUTED", "")  # recorded, so the teardown restores what quiet_dask sets
    monkeypatch.delenv("DASK_LOGGING__DISTRIBUTED")
    monkeypatch.delenv("CTRPIPE_LOG_LEVEL", raising=False)
    dask_log = logging.getLogger("distributed")
    monkeypatch.setattr(dask_log, "level", logging.INFO)
    quiet_dask()
    assert dask_log.level == logging.WARNING
    assert os.environ["DASK_LOGGING__DISTRIBUTED"] == "warning"  # a local cluster's worker processes read it
