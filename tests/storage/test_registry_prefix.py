"""The registry and the model readers on an object store (memory://), where committed files sit under a data prefix."""

from __future__ import annotations

import uuid

import fsspec

from storage import fsio
from storage.registry import ModelRegistry
from trainer import checkpoint


def _commit_model(url: str, run: str) -> None:
    fs, final = fsio.get_fs(url)
    with fsio.staged(fs, final) as stage:
        fsio.write_json(fs, f"{stage}/{checkpoint.MODEL_JSON}", {"run_tag": run})
        fs.pipe(f"{stage}/{checkpoint.SPARSE}/part-00000.parquet", run.encode())
        fsio.commit_dir(fs, stage, final, {"run_tag": run})


def test_versions_copy_the_candidates_files_and_urls_resolve_to_them():
    root = f"memory:///reg-{uuid.uuid4().hex[:8]}"
    candidate = f"{root}/runs/date=2026-01-01/model"
    _commit_model(candidate, "day1")
    assert checkpoint.read_model_json(candidate) == {"run_tag": "day1"}  # the outer URL reads through the manifest

    reg = ModelRegistry(root, "ctr")
    v1 = reg.add_version(candidate, metrics={"auc": 0.7}, lineage={}, status="candidate")
    _commit_model(candidate, "day2")  # the next day's candidate replaces the run's files, not the version's
    reg.publish(v1)
    assert reg.versions() == [v1] and reg.latest() == v1 and reg.info(v1).status == "published"
    assert reg.read_json(v1, "model.json") == {"run_tag": "day1"} and reg.info(v1).metrics == {"auc": 0.7}
    url = reg.url(v1)
    assert url.startswith(f"{root}/models/ctr/{v1}/v-") and fsio.data_url(url) == url
    assert checkpoint.read_model_json(url) == {"run_tag": "day1"}
    fs = fsspec.filesystem("memory")
    assert fs.cat(fsio.get_fs(fsio.join(url, checkpoint.SPARSE, "part-00000.parquet"))[1]) == b"day1"
    files = fsio.data_files(fs, reg.path(v1), fsio.read_manifest(fs, reg.path(v1)))
    assert files == ["lineage.json", "metrics.json", "model.json", "sparse/part-00000.parquet", "status.json"]
