"""The publish gate and the model registry: a broken or worse model never becomes LATEST."""

import math

import pytest

from flows.stages import gate
from storage import fsio
from storage.registry import ModelRegistry, RegistryError, validate_version
from trainer.config import PublishConfig

CFG = PublishConfig(max_auc_drop=0.01, min_eval_rows=100)


def m(auc, loss=0.5, rows=1000):
    return {"auc": auc, "logloss": loss, "rows": rows}


def test_first_model_is_published():
    assert gate(m(0.70), None, CFG) == (True, "first model")


def test_small_drop_within_tolerance_publishes():
    ok, _ = gate(m(0.695), m(0.70), CFG)
    assert ok


def test_large_drop_is_refused_with_reason():
    ok, reason = gate(m(0.60), m(0.70), CFG)
    assert not ok and "0.1000 below" in reason and "max_auc_drop" in reason


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_metrics_are_refused(bad):
    ok, reason = gate(m(bad), None, CFG)
    assert not ok and "not finite" in reason
    ok, _ = gate(m(0.7, loss=bad), None, CFG)
    assert not ok


def test_too_few_eval_rows_is_refused():
    ok, reason = gate(m(0.9, rows=10), None, CFG)
    assert not ok and "min_eval_rows" in reason


def _candidate(tmp_path, name="cand"):
    fs, path = fsio.get_fs(str(tmp_path / name))
    staging = fsio.staging_dir(fs, path)
    fs.makedirs(f"{staging}/sparse", exist_ok=True)
    fs.pipe(f"{staging}/model.json", b'{"run_tag": "x"}')
    fs.pipe(f"{staging}/sparse/part-00000.parquet", b"not really parquet")
    fsio.commit_dir(fs, staging, path, {"ok": True})
    return str(tmp_path / name)


def test_registry_versions_publish_refuse_and_rollback(tmp_path):
    reg = ModelRegistry(str(tmp_path / "root"), "ctr")
    assert reg.latest() is None
    cand = _candidate(tmp_path)
    v1 = reg.add_version(cand, metrics={"auc": 0.7}, lineage={"date": "2026-01-01"}, status="candidate")
    reg.publish(v1)
    v2 = reg.add_version(cand, metrics={"auc": 0.5}, lineage={}, status="refused", reason="worse")
    assert (v1, v2) == ("v00001", "v00002")
    assert reg.latest() == v1  # a refused version never moves LATEST
    assert reg.info(v2).status == "refused" and reg.info(v2).reason == "worse"
    assert reg.read_json(v1, "model.json") == {"run_tag": "x"}
    v3 = reg.add_version(cand, metrics={"auc": 0.72}, lineage={}, status="candidate")
    reg.publish(v3)
    assert reg.latest() == v3
    reg.rollback(v1)
    assert reg.latest() == v1
    with pytest.raises(RegistryError, match="never published"):
        reg.rollback(v2)


def test_uncommitted_candidate_is_not_registered(tmp_path):
    (tmp_path / "half").mkdir()
    reg = ModelRegistry(str(tmp_path / "root"), "ctr")
    with pytest.raises(RegistryError, match="not committed"):
        reg.add_version(str(tmp_path / "half"), metrics={}, lineage={}, status="candidate")
    assert reg.versions() == []


@pytest.mark.parametrize("bad", ["../v00001", "/etc/passwd", "v1", "latest", "v00001/.."])
def test_versions_cannot_escape_the_registry(bad):
    with pytest.raises(ValueError, match="model version"):
        validate_version(bad)


@pytest.mark.parametrize("bad", ["2026-13-01", "../2026-01-01", "20260101", "2026-01-01/.."])
def test_dates_are_validated_before_becoming_paths(bad):
    with pytest.raises(ValueError):
        fsio.validate_date(bad)
