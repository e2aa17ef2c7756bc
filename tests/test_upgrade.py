"""An upgrade from a release: a root a release's code wrote is continued by this code, default configs on both sides.

RELEASES lists each release's version and commit; the test starts from the first release (0.1.0) and from the newest
one listed with a commit (once when they are the same).  That release's code, taken from this repository's history
with `git archive`, runs one day on a fresh root in its own process with its own test config (its
`tests/helpers/serving.day_config`: the demo preset, a lenient gate): it publishes v00001 and its serving bundle,
and scores a few lines with that bundle.  This code then runs the next day on the same root with the same test
config, nothing kept by hand: the lineage keeps its published model's shape keys (`flows.config.lineage_config`,
e.g. 0.1.0's `model.cross_input: tokens` where today's default is `fields`), so the day warm-starts the dense part
and the rows (converted to today's default rows; an SSD shard of another format converted where it lies, none
restored from the snapshot) and publishes v00002.  `ctrpipe models` lists and shows both versions, and `ctrpipe
score-server` serves the old bundle with the scores the old code computed.  A shallow clone skips, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from flows.cli.main import main
from flows.config import lineage_values, shape_keys
from flows.day.record import DayRecord, read_record
from flows.day.run import run_day
from storage.embedding.config import StoreConfig
from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import read_snapshot, snapshot_format
from storage.io.registry import ModelRegistry
from tests.helpers.in_process import isolated
from tests.helpers.procs import free_port
from tests.helpers.releases import release_tree, upgrade_sources
from tests.helpers.serving import call, cli_args, criteo_line, day_config, score_server
from trainer.config import OptimConfig
from trainer.model_dir import SPARSE, read_meta

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun

DAYS = ("2026-04-01", "2026-04-02")
DEFAULT_ROWS = StoreConfig().row_format(OptimConfig().sparse_optimizer).name
"""The rows a day of this code keeps by default (`wide_rowwise_adam/int8s/log8`)."""
LINES = [criteo_line(i, label=i % 2) for i in range(12)]

# Runs a release's code, so it names that release's modules (0.1.0's flows.day was a module).
OLD_DAY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    try:
        from flows.day.run import run_day
    except ImportError:
        from flows.day import run_day
    from flows.serving.bundle import BundleReader
    from flows.serving.model import load_model
    from pipeline.generate import generate_days
    from tests.helpers.serving import day_config

    tmp, days, lines = Path(sys.argv[1]), sys.argv[2].split(","), json.loads(sys.argv[3])
    generate_days(str(tmp / "raw"), len(days), 2500, seed=13, start_date=days[0])
    cfg = day_config(tmp / "root", str(tmp / "raw" / "day_{date}.tsv.gz"))
    record = run_day(cfg, days[0]).record
    model = load_model([BundleReader(cfg.layout().bundle(record.model_version))])
    scores = model.score_features(model.parse(lines=lines).features)
    print(json.dumps({"status": record.status, "version": record.model_version, "scores": scores.tolist()}))
""")


class Upgraded(NamedTuple):
    tmp: Path
    cfg: Any
    old_run: dict[str, Any]
    """The release's day: its status, version and the scores of `LINES` by its bundle."""
    old_rows: RowFormat
    """The rows the release's model holds (`adam/fp32` for 0.1.0)."""
    record: DayRecord
    """This code's next day on the root."""


@pytest.fixture(scope="module", params=upgrade_sources(), ids=lambda r: r.version)
def old_root(request, tmp_path_factory):
    """Day 1 run, published and scored by a release's code; the root it left, and the next day's run by this code."""
    tmp = tmp_path_factory.mktemp(f"upgrade-{request.param.version}")
    old = release_tree(request.param, tmp / "release")
    env = {**os.environ, "PYTHONPATH": str(old)}
    done = subprocess.run(
        [sys.executable, "-c", OLD_DAY, str(tmp), ",".join(DAYS), json.dumps(LINES)],
        cwd=old,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    old_run = json.loads(done.stdout.strip().splitlines()[-1])
    assert old_run["status"] == "published" and old_run["version"] == "v00001", old_run
    cfg = day_config(tmp / "root", str(tmp / "raw" / "day_{date}.tsv.gz"))  # no key set: the defaults
    old_rows = snapshot_format(f"{ModelRegistry(cfg.layout()).url('v00001')}/{SPARSE}")
    return Upgraded(tmp, cfg, old_run, old_rows, run_day(cfg, DAYS[1]).record)


def test_the_next_day_warm_starts_the_rows_and_the_dense_part_and_publishes(old_root):
    cfg, old_rows, record = old_root.cfg, old_root.old_rows, old_root.record
    layout, registry = cfg.layout(), ModelRegistry(cfg.layout())
    assert read_record(layout, DAYS[0]).status == "published"  # the old metrics.json reads
    old_meta = read_meta(registry.url("v00001"))  # the old model.json reads
    assert record.status == "published" and record.model_version == "v00002", record.reason
    assert record.parent_version == "v00001" and registry.latest() == "v00002"
    assert record.warm["warm_start"] == "from v00001", record.warm  # the dense part too, with default configs
    meta = read_meta(layout.run_model(DAYS[1]))
    assert meta.init_model_url is not None  # the network started from the old model's weights
    # the lineage kept its published model's shape keys, and both records say where each value came from
    assert lineage_values(meta) == lineage_values(old_meta)
    assert meta.config_sources == record.warm["config_sources"] == dict.fromkeys(shape_keys(), "lineage")
    # its rows were warmed, converted to today's default rows, Adam's second moment kept; no shard was rebuilt
    assert record.warm["published_version"] == "v00001" and record.warm["rows"] > 0
    assert record.warm["shards_restored"] == 0, record.warm
    assert record.warm["converted_from"] == (old_rows.name if old_rows.name != DEFAULT_ROWS else None)
    new_rows = read_snapshot(f"{registry.url('v00002')}/{SPARSE}")
    assert new_rows.fmt.name == DEFAULT_ROWS and new_rows.keys.size > 0
    updated = new_rows.clock > 0
    assert updated.any() and (new_rows.state["v"][updated] > 0).any(), "Adam's second moments carried over"


def test_the_first_release_s_shard_is_converted_where_it_lies(old_root):
    old_rows, record = old_root.old_rows, old_root.record
    if old_rows.name == DEFAULT_ROWS:
        pytest.skip("this release's rows are today's default: its shard is kept as it is")
    converted = record.warm["rebuilt"]["converted_shards"]
    assert len(converted) == 1 and converted[0]["rows"] > 0, record.warm
    if old_rows.name == "adam/fp32":  # 0.1.0
        assert converted[0]["from"] == "ctr-ssd-shard/2 adam/fp32"


def test_models_list_and_show_read_the_old_and_new_versions(old_root, capfd):
    cfg = old_root.cfg

    def ctrpipe(*args: str) -> tuple[int, str]:
        """`ctrpipe ARGS` in this process (`tests.helpers.in_process.isolated`): its exit code and stdout."""
        capfd.readouterr()
        with isolated(old_root.tmp):
            code = main([*args, *cli_args(cfg)])
        out = capfd.readouterr()
        assert code == 0, out.err
        return code, out.out

    _, listed = ctrpipe("models", "list")
    assert "v00001" in listed and "* v00002" in listed
    _, shown = ctrpipe("models", "show", "v00001", "--json")
    assert json.loads(shown)["version"] == "v00001"
    _, summary = ctrpipe("models", "show", "v00002")  # a screen, with the lineage's pins
    assert "model.cross_input=" in summary and "(lineage)" in summary and "dense part from v00001" in summary, summary


def test_the_score_server_serves_the_old_bundle_with_the_old_scores(old_root):
    cfg, old_run = old_root.cfg, old_root.old_run
    port = free_port()
    with score_server([*cli_args(cfg), "--model", "v00001"], port, old_root.tmp / "server.log"):
        status, body = call(port, "POST", "/v1/score", {"lines": LINES})
    assert status == 200 and body["model_version"] == "v00001", body
    assert body["scores"] == pytest.approx(old_run["scores"], abs=1e-6)
