"""The layout: every path under the root comes from one object, and nothing unvalidated becomes a path."""

import pytest

from storage.io import dates
from storage.io.layout import Layout, NodeLayout, date_of, root_digest, validate_version


@pytest.mark.parametrize("bad", ["2026-13-01", "../2026-01-01", "20260101", "2026-01-01/.."])
def test_dates_are_validated_before_becoming_paths(bad):
    with pytest.raises(ValueError):
        dates.validate_date(bad)


@pytest.mark.parametrize("bad", ["../v00001", "/etc/passwd", "v1", "latest", "v00001/.."])
def test_versions_cannot_escape_the_registry(bad):
    with pytest.raises(ValueError, match="model version"):
        validate_version(bad)


def test_every_path_of_a_day_and_a_model_comes_from_the_layout():
    layout = Layout("s3://bucket/ctr/", "m1")
    assert layout.root == "s3://bucket/ctr"
    assert layout.events("2026-01-05") == "s3://bucket/ctr/events/date=2026-01-05"
    assert layout.quarantine("2026-01-05") == "s3://bucket/ctr/quarantine/date=2026-01-05"
    assert layout.vocab("2026-01-05") == "s3://bucket/ctr/vocab/date=2026-01-05"
    assert layout.features("2026-01-05") == "s3://bucket/ctr/features/date=2026-01-05"
    assert layout.run_model("2026-01-05") == "s3://bucket/ctr/runs/m1/date=2026-01-05/model"
    assert layout.run_record("2026-01-05").endswith("runs/m1/date=2026-01-05/metrics.json")
    assert layout.run_checks_chart("2026-01-05").endswith("runs/m1/date=2026-01-05/checks.png")
    assert layout.version("v00003") == "s3://bucket/ctr/models/m1/v00003"
    assert layout.latest_pointer() == "s3://bucket/ctr/models/m1/LATEST"
    assert layout.slot_holder() == "s3://bucket/ctr/models/m1/slot-holder.json"
    assert date_of("s3://bucket/ctr/vocab/date=2026-01-05") == "2026-01-05" and date_of("vocab/x") is None


def test_vocabularies_and_features_are_filed_under_their_config_keys():
    keyed = Layout("s3://bucket/ctr", "m2", vocab_key="v1a2", features_key="f3b4")
    assert keyed.vocab("2026-01-05") == "s3://bucket/ctr/vocab/v1a2/date=2026-01-05"
    assert keyed.vocab_parent() == "s3://bucket/ctr/vocab/v1a2"
    assert keyed.features("2026-01-05") == "s3://bucket/ctr/features/f3b4/date=2026-01-05"
    assert keyed.events("2026-01-05") == Layout("s3://bucket/ctr", "m1").events("2026-01-05")  # shared
    with pytest.raises(ValueError, match="vocab_key"):
        Layout("s3://bucket/ctr", "m1", vocab_key="../x")


def test_node_local_paths_are_local_and_per_model(tmp_path):
    layout = Layout(str(tmp_path / "root"), "m1")
    assert layout.local_dir == str((tmp_path / "root" / "_local").resolve())
    assert layout.node.shard(3, 16) == f"{layout.local_dir}/m1/shard-00003-of-00016"
    assert Layout("s3://b/x", "m1").local_dir != Layout("s3://b/y", "m1").local_dir  # roots never share shards
    with pytest.raises(ValueError, match="rank"):
        layout.node.shard(4, 4)
    with pytest.raises(ValueError, match="model_name"):
        Layout(str(tmp_path), "../x")
    with pytest.raises(ValueError, match="local path"):
        NodeLayout("s3://b/x", "m1")


def test_bundle_paths_come_from_the_layout_and_delta_names_parse_back():
    from storage.io.layout import delta_versions

    layout = Layout("s3://bucket/ctr", "m1")
    assert layout.bundle("v00004") == "s3://bucket/ctr/bundles/m1/v00004"
    assert layout.bundle_latest() == "s3://bucket/ctr/bundles/m1/LATEST"
    delta = layout.bundle_delta("v00004", "v00003")
    assert delta == "s3://bucket/ctr/bundles/m1/deltas/v00004-from-v00003"
    assert delta_versions(delta) == ("v00004", "v00003") and delta_versions("v00004") is None
    with pytest.raises(ValueError, match="model version"):
        layout.bundle_delta("v00004", "../v1")
    assert Layout("/r", "m1", local_dir="/l").node.serving_cache("v00002") == "/l/m1/serving/v00002"


def test_the_slot_lock_sits_beside_the_shards_it_guards(tmp_path):
    layout = Layout(str(tmp_path / "root"), "m1")
    assert layout.node.slot_lock() == f"{layout.local_dir}/m1/slot.lock"
    # per root by default, so runs on unrelated roots never wait for each other
    assert Layout(str(tmp_path / "a"), "m1").node.slot_lock() != Layout(str(tmp_path / "b"), "m1").node.slot_lock()
    assert Layout(str(tmp_path / "a"), "m1").node.slot_lock() != Layout(str(tmp_path / "a"), "m2").node.slot_lock()


def test_a_root_digest_names_a_local_root_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert root_digest("./root") == root_digest(str(tmp_path / "root")) == root_digest(f"{tmp_path}/root/")
    assert root_digest("s3://b/x") == root_digest("s3://b/x/") != root_digest("s3://b/y")
