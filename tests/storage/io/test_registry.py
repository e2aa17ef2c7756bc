"""The registry and the model readers on an object store (memory://), where committed files sit under a data prefix."""

from __future__ import annotations

import json
import uuid

import fsspec
import pytest

from storage.io import fsio
from storage.io.layout import Layout
from storage.io.records import FormatError
from storage.io.registry import LINEAGE, METRICS, STATUS, ModelRegistry, RegistryError
from tests.helpers.formats import newer, sample
from tests.helpers.procs import AWS_ENV, moto_s3
from trainer import model_dir


def _model_json(url: str) -> dict:
    """The model.json of a committed model directory, through its manifest (an object store's data prefix)."""
    fs, path = fsio.get_fs(fsio.data_url(url))
    return fsio.read_json(fs, f"{path}/{model_dir.MODEL_JSON}")


def _commit_model(url: str, run: str) -> None:
    fs, final = fsio.get_fs(url)
    with fsio.staged(fs, final) as stage:
        fsio.write_json(fs, f"{stage}/{model_dir.MODEL_JSON}", {"run_tag": run})
        fs.pipe(f"{stage}/{model_dir.SPARSE}/part-00000.parquet", run.encode())
        fsio.commit_dir(fs, stage, final, {"run_tag": run})


def test_versions_copy_the_candidates_files_and_urls_resolve_to_them():
    root = f"memory:///reg-{uuid.uuid4().hex[:8]}"
    candidate = f"{root}/runs/date=2026-01-01/model"
    _commit_model(candidate, "day1")
    assert _model_json(candidate) == {"run_tag": "day1"}  # the outer URL reads through the manifest

    reg = ModelRegistry(Layout(root, "ctr"))
    v1 = reg.add_version(candidate, metrics={"auc": 0.7}, lineage={}, status="candidate")
    _commit_model(candidate, "day2")  # the next day's candidate replaces the run's files, not the version's
    reg.publish(v1)
    assert reg.versions() == [v1] and reg.latest() == v1 and reg.info(v1).status == "published"
    assert reg.read_json(v1, "model.json") == {"run_tag": "day1"} and reg.info(v1).metrics == {"auc": 0.7}
    url = reg.url(v1)
    assert url.startswith(f"{root}/models/ctr/{v1}/v-") and fsio.data_url(url) == url
    assert _model_json(url) == {"run_tag": "day1"}
    fs = fsspec.filesystem("memory")
    assert fs.cat(fsio.get_fs(fsio.join(url, model_dir.SPARSE, "part-00000.parquet"))[1]) == b"day1"
    files = fsio.data_files(fs, reg.path(v1), fsio.read_manifest(fs, reg.path(v1)))
    assert files == ["lineage.json", "metrics.json", "model.json", "sparse/part-00000.parquet", "status.json"]


def _candidate(tmp_path, name="cand"):
    fs, path = fsio.get_fs(str(tmp_path / name))
    staging = fsio.staging_dir(fs, path)
    fs.makedirs(f"{staging}/sparse", exist_ok=True)
    fs.pipe(f"{staging}/model.json", b'{"run_tag": "x"}')
    fs.pipe(f"{staging}/sparse/part-00000.parquet", b"not really parquet")
    fsio.commit_dir(fs, staging, path, {"ok": True})
    return str(tmp_path / name)


def test_registry_versions_publish_refuse_and_rollback(tmp_path):
    reg = ModelRegistry(Layout(str(tmp_path / "root"), "ctr"))
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
    reg = ModelRegistry(Layout(str(tmp_path / "root"), "ctr"))
    with pytest.raises(RegistryError, match="not committed"):
        reg.add_version(str(tmp_path / "half"), metrics={}, lineage={}, status="candidate")
    assert reg.versions() == []


def _published_and_refused(tmp_path, pattern: str) -> ModelRegistry:
    """A registry whose versions follow `pattern` ('p' published, 'r' refused), each with a bundle and a delta."""
    layout = Layout(str(tmp_path / "root"), "ctr")
    reg = ModelRegistry(layout)
    cand = _candidate(tmp_path)
    last = None
    for kind in pattern:
        v = reg.add_version(cand, metrics={}, lineage={}, status="candidate" if kind == "p" else "refused")
        if kind == "p":
            reg.publish(v)
            for url, size in ((layout.bundle(v), 100), *(((layout.bundle_delta(v, last), 10),) if last else ())):
                path = reg.layout.fs(url)[1]
                reg.fs.makedirs(path, exist_ok=True)
                reg.fs.pipe(f"{path}/rows.npy", b"x" * size)
            last = v
    return reg


def test_prune_keeps_latest_the_rollback_window_young_refusals_and_the_base_of_kept_deltas(tmp_path):
    import datetime as dt

    from storage.io.registry import RegistryConfig

    reg = _published_and_refused(tmp_path, "pprppp")  # v1 v2 p, v3 refused, v4 v5 v6 p
    reg.rollback("v00005")  # LATEST is no longer the newest
    cfg = RegistryConfig(keep_versions=2, keep_refused_days=7)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=8)
    plan = reg.prune_plan(cfg, now=later)
    assert plan.keep == {
        "v00004": "base of the delta of v00005",
        "v00005": "LATEST",
        "v00006": "newest (ids are never reused)",
    }
    assert plan.delete == ["v00001", "v00002", "v00003"]
    assert plan.delete_deltas == ["v00002-from-v00001", "v00004-from-v00002"]
    assert plan.freed_bytes == sum(reg.version_bytes(v) for v in plan.delete) + 2 * 100 + 2 * 10
    assert reg.prune(cfg, dry_run=True, now=later) == plan and reg.versions()[0] == "v00001"  # dry run: nothing gone

    assert reg.prune_plan(cfg).keep["v00003"].startswith("refused, younger than 7 days")  # not yet 7 days old
    reg.prune(cfg, now=later)
    assert reg.versions() == ["v00004", "v00005", "v00006"] and reg.latest() == "v00005"
    assert reg.deltas() == [("v00005", "v00004"), ("v00006", "v00005")]
    assert reg.bundle_bytes("v00002") == 0 and reg.bundle_bytes("v00004") == 100
    v7 = reg.add_version(_candidate(tmp_path, "c2"), metrics={}, lineage={}, status="candidate")
    assert v7 == "v00007"  # ids go on after the kept newest, never reused


def test_registry_config_refuses_an_empty_rollback_window():
    from storage.io.registry import RegistryConfig

    with pytest.raises(ValueError, match="keep_versions"):
        RegistryConfig(keep_versions=0)


def test_latest_and_previous_name_the_published_versions(tmp_path):
    reg = ModelRegistry(Layout(str(tmp_path / "root"), "ctr"))
    with pytest.raises(RegistryError, match=r"no published version under \S+ \(LATEST is unset\); run a daily retrain"):
        reg.resolve("latest")
    cand = _candidate(tmp_path)
    v1 = reg.add_version(cand, metrics={}, lineage={}, status="candidate")
    reg.publish(v1)
    with pytest.raises(RegistryError, match="no published version of model ctr precedes LATEST"):
        reg.resolve("previous")
    reg.add_version(cand, metrics={}, lineage={}, status="refused", reason="worse")
    v3 = reg.add_version(cand, metrics={}, lineage={}, status="candidate")
    reg.publish(v3)
    assert (reg.resolve("latest"), reg.resolve("previous"), reg.resolve("v00002")) == (v3, v1, "v00002")
    reg.rollback(reg.resolve("previous"))
    assert reg.resolve("latest") == v1
    with pytest.raises(ValueError, match="must be latest, previous or look like v00001, got 'newest'"):
        reg.resolve("newest")


def test_a_version_is_found_by_the_run_tag_it_was_registered_for(tmp_path):
    reg = ModelRegistry(Layout(str(tmp_path / "root"), "ctr"))
    cand = _candidate(tmp_path)
    assert reg.find("2026-01-01:none:abc") is None
    v1 = reg.add_version(cand, metrics={}, lineage={}, status="candidate", run_tag="2026-01-01:none:abc")
    v2 = reg.add_version(cand, metrics={}, lineage={}, status="refused", run_tag="2026-01-02:v00001:def")
    reg.add_version(cand, metrics={}, lineage={}, status="candidate")  # no tag: never found
    assert reg.find("2026-01-01:none:abc") == v1 and reg.find("2026-01-02:v00001:def") == v2
    assert reg.find("2026-01-03:v00001:def") is None


def test_publishing_a_version_twice_is_the_same_as_once(tmp_path):
    reg = ModelRegistry(Layout(str(tmp_path / "root"), "ctr"))
    v1 = reg.add_version(_candidate(tmp_path), metrics={}, lineage={}, status="candidate")
    reg.publish(v1)
    reg.publish(v1)  # a rerun of a publish stopped after LATEST moved
    assert reg.latest() == v1 and reg.info(v1).status == "published" and reg.versions() == [v1]
    assert sorted(p.name for p in (tmp_path / "root" / "models" / "ctr").iterdir()) == ["LATEST", v1]


@pytest.mark.server  # a moto S3 server
def test_a_candidate_on_an_object_store_is_read_with_the_roots_storage_options(tmp_path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("moto") is None:
        pytest.skip("needs moto: pip install 'moto[server]>=5'")
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    with moto_s3(tmp_path) as options:  # a custom endpoint: only the storage options know it
        layout = Layout("s3://ctr/root", "ctr", options)
        fs, final = layout.fs(layout.run_model("2026-01-01"))
        with fsio.staged(fs, final) as stage:
            fs.pipe(f"{stage}/{model_dir.MODEL_JSON}", b'{"run_tag": "t"}')
            fsio.commit_dir(fs, stage, final, {"run_tag": "t"})
        reg = ModelRegistry(layout)
        v1 = reg.add_version(layout.run_model("2026-01-01"), metrics={}, lineage={}, status="candidate")
        assert reg.read_json(v1, model_dir.MODEL_JSON) == {"run_tag": "t"}


# ---- lineage.json, status.json and metrics.json outlive the code that wrote them ----------------
def _version_with(tmp_path, **files):
    """A version whose files named in `files` (lineage, status, metrics) are replaced by the given content."""
    reg = ModelRegistry(Layout(str(tmp_path / "root"), "ctr"))
    version = reg.add_version(
        _candidate(tmp_path), metrics={"auc": 0.7}, lineage={"date": "2026-01-01"}, status="candidate"
    )
    for name, data in files.items():
        (tmp_path / "root" / "models" / "ctr" / version / f"{name}.json").write_text(json.dumps(data))
    return reg, version


def test_todays_lineage_status_and_metrics_files_are_read(tmp_path):
    reg, v = _version_with(
        tmp_path,
        lineage=sample("lineage-v1.json"),
        status=sample("version-status-v1.json"),
        metrics=sample("version-metrics-v1.json"),
    )
    lineage = reg.lineage(v)
    assert (lineage.date, lineage.parent_version, lineage.input_format) == ("2026-04-02", "v00001", "criteo")
    assert lineage.format == LINEAGE.tag and lineage.dates_trained == ("2026-04-02",)
    info = reg.info(v)
    assert info.status == "published" and info.metrics == sample("version-metrics-v1.json")


def test_unknown_and_retired_fields_are_ignored_and_kept_when_published(tmp_path):
    reg, v = _version_with(
        tmp_path,
        lineage=newer(sample("lineage-v1.json"), config="retired_section"),
        status={**sample("version-status-v1.json"), "status": "candidate", "later": 1},
        metrics=newer(sample("version-metrics-v1.json")),
    )
    assert reg.lineage(v).parent_version == "v00001" and reg.info(v).metrics["field_of_a_later_release"]
    reg.publish(v)
    assert reg.read_json(v, "status.json")["later"] == 1 and reg.info(v).status == "published"


def test_a_newer_lineage_or_status_is_refused_naming_the_file(tmp_path):
    reg, v = _version_with(
        tmp_path,
        lineage={**sample("lineage-v1.json"), "format": "ctr-pipeline-lineage/2"},
        status={**sample("version-status-v1.json"), "format": "ctr-pipeline-version-status/7"},
    )
    with pytest.raises(
        FormatError,
        match=rf"{v}/lineage.json has format 'ctr-pipeline-lineage/2', written by a newer "
        r"ctr-pipeline; this code reads ctr-pipeline-lineage/1: upgrade",
    ):
        reg.lineage(v)
    with pytest.raises(FormatError, match=r"status.json has format 'ctr-pipeline-version-status/7'"):
        reg.info(v)


def test_the_writer_stamps_each_files_format(tmp_path):
    reg, v = _version_with(tmp_path)
    assert reg.read_json(v, "lineage.json") == {"date": "2026-01-01", "format": LINEAGE.tag}
    assert reg.read_json(v, "metrics.json") == {"auc": 0.7, "format": METRICS.tag}
    assert reg.read_json(v, "status.json")["format"] == STATUS.tag
    assert reg.info(v).metrics == {"auc": 0.7} and reg.lineage(v).date == "2026-01-01"
