"""A SIGKILL at any moment of ingest, vocab or encode leaves the committed state readable; a rerun completes
the date with exactly the rows of an uninterrupted run."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest

from pipeline.config import IngestConfig, VocabConfig
from pipeline.ingest.stage import read_quarantine
from storage.io.layout import Layout
from tests.helpers.procs import REPO
from tests.helpers.stage_runs import StageConfigs, run_stages, stage_command

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]  # kills processes mid-write: minutes, not seconds

DATES = ("2026-01-01", "2026-01-02")
STAGES = ("events", "quarantine", "vocab", "features")
CONFIGS = StageConfigs(
    ingest=IngestConfig(rows_per_partition=300, max_bad_fraction=0.05), vocab=VocabConfig(window_days=2, min_count=2)
)
"""Small partitions, so there are many writes to interrupt."""


def run_all(root: Path, date: str, client) -> None:
    run_stages(date, layout=Layout(str(root)), client=client, configs=CONFIGS)


def snapshot(root: Path, date: str) -> dict[str, pd.DataFrame]:
    out = {}
    for stage, sub in (("events", ""), ("vocab", "vocab.parquet"), ("features", "train"), ("features", "eval")):
        d = root / stage / f"date={date}"
        assert (d / "_SUCCESS.json").exists(), d
        out[f"{stage}/{sub}"] = pd.read_parquet(d / sub if sub else d)
    out["quarantine"] = read_quarantine(Layout(str(root)), date)
    return out


def check_committed_dirs_are_complete(root: Path) -> None:
    """Every directory with a manifest holds the parts its manifest lists (nothing half-written is trusted)."""
    for manifest in root.glob("*/date=*/_SUCCESS.json"):
        m = json.loads(manifest.read_text())
        for p in m.get("parts", []):
            assert len(pd.read_parquet(manifest.parent / p["name"])) == p["rows"]


def test_sigkill_at_random_moments_then_rerun_gives_the_uninterrupted_result(tmp_path, raw_days, client):
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    for root in (reference, crashed):
        (root / "raw").mkdir(parents=True)
        for d in DATES:
            shutil.copy(raw_days.path / f"day_{d}.tsv.gz", root / "raw")
    for d in DATES:
        run_all(reference, d, client)
    run_all(crashed, DATES[0], client)  # the previous committed state
    before = snapshot(crashed, DATES[0])
    manifests = {s: (crashed / s / f"date={DATES[0]}" / "_SUCCESS.json").read_text() for s in STAGES}

    rng = random.Random(1234)  # seeded: a failure can be replayed
    kills = 0
    for _ in range(8):  # until two runs were killed mid-work (a run can finish before its kill)
        if kills >= 2:
            break
        proc = subprocess.Popen(
            stage_command(DATES[1], root=str(crashed), configs=CONFIGS),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not list(crashed.glob("*/date=*.staging-*")):
            time.sleep(0.01)  # wait until a stage is writing, then kill at a random moment of its work
        time.sleep(rng.uniform(0.0, 0.5))
        if proc.poll() is None:
            proc.kill()
            kills += 1
        proc.wait(timeout=30)
        for s in STAGES:  # the previous date is untouched and readable
            assert (crashed / s / f"date={DATES[0]}" / "_SUCCESS.json").read_text() == manifests[s]
        check_committed_dirs_are_complete(crashed)
    assert kills >= 1, "every run finished before its kill: nothing was interrupted"
    for k, frame in snapshot(crashed, DATES[0]).items():
        pd.testing.assert_frame_equal(frame, before[k], obj=k)

    run_all(crashed, DATES[1], client)
    got, want = snapshot(crashed, DATES[1]), snapshot(reference, DATES[1])
    for k in want:
        pd.testing.assert_frame_equal(got[k], want[k], obj=k)
    leftovers = [p.name for s in STAGES for p in (crashed / s).iterdir() if ".staging-" in p.name or ".old-" in p.name]
    assert leftovers == []
