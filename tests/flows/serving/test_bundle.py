"""A bundle is committed whole, lists every file with its checksum, and a corrupt file is refused."""

from __future__ import annotations

import json

import pytest

from flows.serving.bundle import (
    BUNDLE,
    EMB,
    MANIFEST,
    PROGRAM,
    BundleError,
    BundleReader,
    write_bundle,
)
from tests.helpers.formats import newer, sample
from tests.helpers.serving import write_tiny_bundle


def test_the_manifest_lists_every_file_with_its_size_and_checksum(tmp_path):
    manifest = write_tiny_bundle(str(tmp_path / "b"))
    reader = BundleReader(str(tmp_path / "b"))
    assert reader.version == "v00001" and reader.kind == "full" and reader.manifest == manifest
    on_disk = {str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {MANIFEST, "_SUCCESS.json"}
    assert manifest["bytes_total"] == sum(f["bytes"] for f in manifest["files"].values())
    assert all((tmp_path / "b" / name).stat().st_size == f["bytes"] for name, f in manifest["files"].items())
    assert reader.read_array(EMB).shape == (manifest["rows"], 4)


def test_a_corrupt_or_missing_file_and_an_uncommitted_or_foreign_bundle_are_refused(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    program = tmp_path / "b" / PROGRAM
    program.write_bytes(program.read_bytes()[:-1] + b"X")
    with pytest.raises(BundleError, match="dense.pt2 fails its checksum"):
        BundleReader(str(tmp_path / "b")).read(PROGRAM)
    with pytest.raises(BundleError, match="has no dense.onnx"):
        BundleReader(str(tmp_path / "b")).read("dense.onnx")
    (tmp_path / "half").mkdir()
    with pytest.raises(BundleError, match="no committed bundle"):
        BundleReader(str(tmp_path / "half"))
    manifest = json.loads((tmp_path / "b" / MANIFEST).read_text())
    (tmp_path / "b" / MANIFEST).write_text(json.dumps({**manifest, "format": "other/9"}))
    with pytest.raises(BundleError, match="format 'other/9'"):
        BundleReader(str(tmp_path / "b"))


def test_a_manifest_without_version_or_kind_is_not_written(tmp_path):
    with pytest.raises(ValueError, match="version and a kind"):
        write_bundle(str(tmp_path / "b"), {}, {"version": "v00001", "kind": "partial"})
    assert not (tmp_path / "b").exists()


# ---- a bundle outlives the trainer that wrote it ------------------------------------------------
def test_todays_manifests_are_of_the_version_read():
    for name in ("bundle-manifest-v1.json", "bundle-delta-manifest-v1.json"):
        manifest = sample(name)
        assert BUNDLE.version_of(manifest, name) == 1 and {"version", "kind", "files"} <= set(manifest)


def test_a_newer_trainers_manifest_fields_are_ignored_and_a_newer_version_is_refused(tmp_path):
    write_tiny_bundle(str(tmp_path / "b"))
    path = tmp_path / "b" / MANIFEST
    manifest = json.loads(path.read_text())
    path.write_text(json.dumps(newer(manifest, lineage="retired_pointer")))
    reader = BundleReader(str(tmp_path / "b"))
    assert reader.version == "v00001" and reader.read_array(EMB).shape == (manifest["rows"], 4)
    path.write_text(json.dumps({**manifest, "format": "ctr-pipeline-bundle/2"}))
    with pytest.raises(
        BundleError,
        match=r"manifest.json has format 'ctr-pipeline-bundle/2', written by a newer "
        r"ctr-pipeline; this code reads ctr-pipeline-bundle/1: upgrade",
    ):
        BundleReader(str(tmp_path / "b"))
    path.write_text(json.dumps({k: v for k, v in manifest.items() if k != "files"}))
    with pytest.raises(BundleError, match="manifest.json lacks files: the bundle is corrupt"):
        BundleReader(str(tmp_path / "b"))
