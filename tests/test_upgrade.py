"""An upgrade: a root written by the previous release is continued by this code.

The previous release's code (`PREVIOUS_RELEASE`, taken from this repository's history with `git
archive`) runs one day on a fresh root in its own process: it publishes v00001 and its serving bundle,
and scores a few lines with that bundle.  This code then runs the next day on the same root (warm start
from the old model's rows, fp32 with Adam's moments, converted to the default fp16 rows, and from its dense
weights; the old SSD shards rebuilt; publish v00002), lists and shows the registry's versions through
`ctrpipe models`, and serves the old bundle with `ctrpipe score-server`: the scores must be the ones the
old code computed.  Moving `PREVIOUS_RELEASE` forward is part of each release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from flows.day.record import read_record
from flows.day.run import run_day
from storage.embedding.config import StoreConfig
from storage.embedding.snapshot import read_snapshot, snapshot_format
from storage.io.registry import ModelRegistry
from tests.conftest import REPO
from tests.helpers.procs import free_port
from tests.helpers.serving import call, cli_args, criteo_line, day_config, score_server
from trainer.config import OptimConfig
from trainer.model_dir import SPARSE, read_meta

pytestmark = [pytest.mark.slow, pytest.mark.server]  # days run: a Dask scheduler, Prefect, torchrun

PREVIOUS_RELEASE = "56e72fbd9a05cfe1899514d08b84e8b1898264a7"
"""The last commit before compact rows (issue 28): fp32 embedding rows with Adam's m and v in every snapshot,
208-byte SSD records (`ctr-ssd-shard/2`).  (The releases before it, whose records had no format versions,
are read through the samples of `tests/data/formats`.)"""

DAYS = ("2026-04-01", "2026-04-02")
DEFAULT_ROWS = StoreConfig().row_format(OptimConfig().sparse_optimizer).name
"""The rows a day of the current release keeps by default (`adam/int8/log8`)."""
LINES = [criteo_line(i, label=i % 2) for i in range(12)]

# Runs the previous release's code, so it names that release's modules.
OLD_DAY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from flows.day.run import run_day
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


def _previous_release(dest: Path) -> Path:
    """The previous release's source tree at `dest` (the packages and the test helpers its script uses)."""
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: the previous release's code comes from its history")
    have = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True
    )
    assert have.returncode == 0, (
        f"commit {PREVIOUS_RELEASE} is not in this clone's history; "
        "fetch it (git fetch --unshallow) to run the upgrade test"
    )
    archive = dest.with_suffix(".tar")
    with archive.open("wb") as out:
        subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "archive",
                "--format=tar",
                PREVIOUS_RELEASE,
                "flows",
                "pipeline",
                "trainer",
                "storage",
                "tests/__init__.py",
                "tests/helpers",
            ],
            stdout=out,
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def old_root(tmp_path_factory):
    """Day 1 run, published and scored by the previous release; the root it left."""
    tmp = tmp_path_factory.mktemp("upgrade")
    old = _previous_release(tmp / "previous-release")
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
    return tmp, old_run


KEEP_NETWORK = {"model.cross_input": "tokens"}
"""What the upgrade note tells a user who keeps the previous release's network (its cross term crossed every
token; today's default crosses the field tokens, another shape, so the default's next day starts its dense part
cold: tests/trainer/test_model_dir.py)."""


def test_the_next_day_warm_starts_from_the_old_model_and_publishes(old_root):
    tmp, _ = old_root
    cfg = day_config(tmp / "root", str(tmp / "raw" / "day_{date}.tsv.gz"), **KEEP_NETWORK)
    layout = cfg.layout()
    assert read_record(layout, DAYS[0]).status == "published"  # the old metrics.json reads
    old_meta = read_meta(ModelRegistry(layout).url("v00001"))  # the old model.json reads
    assert old_meta.model_name == "ctr"

    record = run_day(cfg, DAYS[1]).record
    assert record.status == "published" and record.model_version == "v00002", record.reason
    assert record.parent_version == "v00001"
    meta = read_meta(layout.run_model(DAYS[1]))
    assert meta.init_model_url is not None  # the dense network started from the old model's weights
    assert record.warm["published_version"] == "v00001" and record.warm["rows"] > 0  # its rows were warmed
    assert record.warm["warm_start"] == "from v00001", record.warm
    # the old rows were converted, and the new model's rows are today's default, Adam's second moment kept
    assert record.warm["converted_from"] == "adam/fp32" and record.warm["row_format"] == DEFAULT_ROWS
    assert snapshot_format(f"{ModelRegistry(layout).url('v00001')}/{SPARSE}").name == "adam/fp32"
    new_rows = read_snapshot(f"{ModelRegistry(layout).url('v00002')}/{SPARSE}")
    assert new_rows.fmt.name == DEFAULT_ROWS and new_rows.keys.size > 0
    updated = new_rows.clock > 0
    assert updated.any() and (new_rows.state["v"][updated] > 0).any(), "Adam's second moments carried over"
    assert ModelRegistry(layout).latest() == "v00002"


def test_models_list_and_show_read_the_old_and_new_versions(old_root):
    tmp, _ = old_root
    cfg = day_config(tmp / "root", str(tmp / "raw" / "day_{date}.tsv.gz"), **KEEP_NETWORK)
    if ModelRegistry(cfg.layout()).latest() != "v00002":
        run_day(cfg, DAYS[1])

    def ctrpipe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "flows.cli.main", *args, *cli_args(cfg)], capture_output=True, text=True, timeout=300
        )

    listed = ctrpipe("models", "list")
    assert listed.returncode == 0, listed.stderr
    assert "v00001" in listed.stdout and "* v00002" in listed.stdout
    shown = ctrpipe("models", "show", "v00001")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["version"] == "v00001"


def test_the_score_server_serves_the_old_bundle_with_the_old_scores(old_root):
    tmp, old_run = old_root
    cfg = day_config(tmp / "root", str(tmp / "raw" / "day_{date}.tsv.gz"))
    port = free_port()
    with score_server([*cli_args(cfg), "--model", "v00001"], port, tmp / "server.log"):
        status, body = call(port, "POST", "/v1/score", {"lines": LINES})
    assert status == 200 and body["model_version"] == "v00001", body
    assert body["scores"] == pytest.approx(old_run["scores"], abs=1e-6)
