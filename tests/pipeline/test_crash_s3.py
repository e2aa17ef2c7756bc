"""On an s3:// root (a real moto server), a SIGKILL while ingest, vocab or encode writes leaves the previous
committed output of the date readable and byte-for-byte unchanged; a rerun completes the date with exactly
the output of an uninterrupted run, and no data prefix of a killed writer is left behind."""

from __future__ import annotations

import io
import json
import os
import signal
import time

import pandas as pd
import pytest

from pipeline.config import IngestConfig, InputConfig, VocabConfig
from pipeline.generate import generate_days
from pipeline.ingest.stage import read_quarantine
from storage.io import fsio
from storage.io.layout import Layout
from tests.helpers.procs import AWS_ENV, moto_s3, processes, start
from tests.helpers.stage_runs import StageConfigs, run_stages, stage_command

pytestmark = [pytest.mark.slow, pytest.mark.server]  # kills processes mid-write on a moto S3 server: minutes

pytest.importorskip("s3fs")
pytest.importorskip("moto")

DATE = "2026-01-01"
RAW = "s3://ctr/raw"
STAGES = ("events", "quarantine", "vocab", "features")


def configs(so: dict) -> StageConfigs:
    """Input on S3; small partitions, so each stage writes many objects."""
    return StageConfigs(
        input=InputConfig(url=f"{RAW}/day_{{date}}.tsv.gz", storage_options=so),
        ingest=IngestConfig(rows_per_partition=300, max_bad_fraction=0.05),
        vocab=VocabConfig(min_count=2),
    )


def run_all(root: str, so: dict, client) -> None:
    run_stages(DATE, layout=Layout(root, storage_options=so), client=client, configs=configs(so))


def committed(fs, root: str) -> dict[str, tuple[bytes, dict[str, bytes]] | None]:
    """Per stage: the exact bytes of its manifest and of every file it commits, or None when not committed."""
    fs.invalidate_cache()
    out = {}
    for stage in STAGES:
        final = f"{root.removeprefix('s3://')}/{stage}/date={DATE}"
        manifest = fsio.read_manifest(fs, final)
        if manifest is None:
            out[stage] = None
            continue
        base = fsio.data_dir(final, manifest)
        files = {r: fs.cat(f"{base}/{r}") for r in fsio.data_files(fs, final, manifest)}
        out[stage] = (fs.cat(f"{final}/_SUCCESS.json"), files)
        for p in manifest.get("parts", []):  # every part the manifest lists is there, whole
            assert len(pd.read_parquet(io.BytesIO(out[stage][1][p["name"]]))) == p["rows"], (stage, p)
    return out


def frames(root: str, so: dict) -> dict[str, pd.DataFrame]:
    """What the readers of each stage return (run ids and paths aside, a rerun must give the same)."""
    out = {"quarantine": read_quarantine(Layout(root, storage_options=so), DATE)}
    for stage, sub in (("events", ""), ("vocab", "vocab.parquet"), ("features", "train"), ("features", "eval")):
        data = fsio.data_url(f"{root}/{stage}/date={DATE}", so)
        out[f"{stage}/{sub}"] = pd.read_parquet(fsio.join(data, sub) if sub else data, storage_options=so)
    return out


def new_prefix_objects(fs, root: str, stage: str, live: str | None) -> list[str]:
    final = f"{root.removeprefix('s3://')}/{stage}/date={DATE}"
    fs.invalidate_cache()
    return [p for p in fs.find(final) if "/v-" in p and (live is None or f"/{live}/" not in p)]


@pytest.fixture()
def s3(tmp_path, monkeypatch):
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    with moto_s3(tmp_path) as options:
        yield options


def test_sigkill_mid_write_on_s3_keeps_the_old_output_then_the_rerun_gives_the_uninterrupted_result(
    s3, client, tmp_path
):
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    crashed, reference = "s3://ctr/crashed", "s3://ctr/reference"
    generate_days(RAW, 1, 3000, seed=11, start_date=DATE, storage_options=s3)
    run_all(crashed, s3, client)  # the previous committed state
    before = frames(crashed, s3)
    generate_days(RAW, 1, 3000, seed=12, start_date=DATE, storage_options=s3)  # changed input: every stage reruns
    run_all(reference, s3, client)  # what an uninterrupted run of the new input gives

    with processes() as procs:
        for attempt, target in enumerate(("events", "vocab", "features")):
            state = committed(fs, crashed)
            live = json.loads(state[target][0]).get("data")
            command = stage_command(DATE, root=crashed, configs=configs(s3), storage_options=s3)
            proc = start(procs, command, tmp_path / f"run{attempt}.log")
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if new_prefix_objects(fs, crashed, target, live):
                    break
                time.sleep(0.005)
            assert proc.poll() is None, f"the run finished before {target} wrote: see {tmp_path}/run{attempt}.log"
            os.killpg(proc.pid, signal.SIGKILL)  # mid-write: the first object of the new data prefix exists
            proc.wait(timeout=30)
            after = committed(fs, crashed)
            assert after[target] == state[target], f"{target}: the committed output changed under a killed writer"
            assert new_prefix_objects(fs, crashed, target, live), "the killed writer left no data prefix"
            if target == "events":  # nothing was committed: every stage still reads exactly the first input's output
                assert after == state
                for k, frame in frames(crashed, s3).items():
                    pd.testing.assert_frame_equal(frame, before[k], obj=k)

    run_all(crashed, s3, client)  # the rerun completes the date
    got, want = frames(crashed, s3), frames(reference, s3)
    for k in want:
        pd.testing.assert_frame_equal(got[k], want[k], obj=k)
    for stage, (manifest, files) in committed(fs, crashed).items():  # killed writers' prefixes were removed
        data = json.loads(manifest)["data"]
        final = f"ctr/crashed/{stage}/date={DATE}"
        assert sorted(fs.find(final)) == sorted(
            [f"{final}/_SUCCESS.json", f"{final}/{data}/_SUCCESS.json", *(f"{final}/{data}/{r}" for r in files)]
        ), stage
