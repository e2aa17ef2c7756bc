"""The data stages against real services started by the test: a Dask scheduler with two worker
processes on 127.0.0.1, and an S3-compatible server (moto_server) holding the root and the input."""

from __future__ import annotations

import importlib.util
import json

import pandas as pd
import pytest
from distributed import Client

from pipeline.cluster import dask_client
from pipeline.config import DaskConfig, IngestConfig, InputConfig, VocabConfig
from pipeline.generate import generate_days
from pipeline.ingest.stage import ingest_date, read_quarantine
from pipeline.vocab.stage import load_admitted
from storage.io import fsio
from storage.io.layout import Layout
from tests.helpers.procs import (
    AWS_ENV,
    BIN,
    free_port,
    moto_s3,
    processes,
    start,
    wait_port,
)
from tests.helpers.stage_runs import StageConfigs, StageResults, run_stages

pytestmark = [pytest.mark.slow, pytest.mark.server]  # a real scheduler and a moto S3 server: tens of seconds

DATE = "2026-01-01"


def run_day(
    root: str, client: Client, storage_options: dict | None = None, input: InputConfig | None = None
) -> StageResults:
    configs = StageConfigs(
        input=input or InputConfig(), ingest=IngestConfig(rows_per_partition=800), vocab=VocabConfig(min_count=2)
    )
    return run_stages(DATE, layout=Layout(root, storage_options=storage_options), client=client, configs=configs)


def test_an_existing_scheduler_address_runs_ingest_vocab_and_encode(tmp_path):
    generate_days(str(tmp_path / "root" / "raw"), 1, 3000, seed=5, start_date=DATE)
    port = free_port()
    with processes() as procs:
        scheduler = start(
            procs,
            [
                str(BIN / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--dashboard-address",
                ":0",
                "--no-show",
            ],
            tmp_path / "scheduler.log",
        )
        wait_port(port, scheduler)
        for w in range(2):
            start(
                procs,
                [
                    str(BIN / "dask"),
                    "worker",
                    f"tcp://127.0.0.1:{port}",
                    "--nthreads",
                    "1",
                    "--host",
                    "127.0.0.1",
                    "--dashboard-address",
                    ":0",
                    "--memory-limit",
                    "1GiB",
                    "--name",
                    f"w{w}",
                ],
                tmp_path / f"worker{w}.log",
            )
        with dask_client(DaskConfig(address=f"tcp://127.0.0.1:{port}")) as client:
            client.wait_for_workers(2, timeout=60)
            workers = {w["name"] for w in client.scheduler_info()["workers"].values()}
            assert workers == {"w0", "w1"}
            i, v, e = run_day(str(tmp_path / "root"), client)
        assert all(p.poll() is None for p in procs)  # connecting and closing the client leaves the cluster up
    assert (i.rows_written, i.parts) == (3000, 4) and v.admitted > 0 and e.rows_train + e.rows_eval == 3000


s3_missing = [m for m in ("s3fs", "moto") if importlib.util.find_spec(m) is None]


@pytest.fixture()
def s3(tmp_path, monkeypatch):
    """A moto S3 server on a free port; yields fsspec storage options for it, with a bucket `ctr`."""
    if s3_missing:
        pytest.skip(f"S3 test needs {' and '.join(s3_missing)}: pip install 's3fs>=2024.6' 'moto[server]>=5'")
    for k, v in AWS_ENV.items():
        monkeypatch.setenv(k, v)
    with moto_s3(tmp_path) as options:
        yield options


def test_root_and_input_on_s3_commit_with_the_manifest_last(s3, client):
    root = "s3://ctr/pipeline"
    generate_days(f"{root}/raw", 1, 3000, seed=5, start_date=DATE, storage_options=s3)
    i, v, e = run_day(root, client, storage_options=s3, input=InputConfig(storage_options=s3))
    assert i.rows_written == 3000 and v.admitted > 0 and e.rows_train + e.rows_eval == 3000
    import s3fs

    fs = s3fs.S3FileSystem(**s3)
    for stage in ("events", "quarantine", "vocab", "features"):
        final = f"ctr/pipeline/{stage}/date={DATE}"
        listing = fs.find(f"ctr/pipeline/{stage}", detail=True)
        assert not [p for p in listing if ".staging-" in p or ".old-" in p], f"{stage}: staging leftovers"
        manifest = json.loads(fs.cat(f"{final}/_SUCCESS.json"))
        data = fsio.data_dir(final, manifest)  # every file lives under the one data prefix the manifest names
        assert data.startswith(f"{final}/v-") and sorted(listing) == sorted([f"{final}/_SUCCESS.json", *fs.find(data)])
        inner = json.loads(fs.cat(f"{data}/_SUCCESS.json"))
        assert inner == {k: v for k, v in manifest.items() if k != "data"}  # the other keys are unchanged
        times = [info["LastModified"] for p, info in listing.items() if p != f"{final}/_SUCCESS.json"]
        assert stage == "quarantine" or len(times) > 1  # nothing was quarantined: only the manifests
        committed_at = listing[f"{final}/_SUCCESS.json"]["LastModified"]
        assert all(committed_at >= t for t in times), f"{stage}: manifest written before data"
    manifest = json.loads(fs.cat(f"ctr/pipeline/events/date={DATE}/_SUCCESS.json"))
    assert manifest["inputs"][0]["url"].startswith("s3://ctr/pipeline/raw/")
    assert (
        len(read_quarantine(Layout(root, storage_options=s3), DATE)) == 0
        and len(load_admitted(Layout(root, storage_options=s3), DATE)) == v.admitted
    )
    train = pd.read_parquet(fsio.join(fsio.data_url(f"{root}/features/date={DATE}", s3), "train"), storage_options=s3)
    assert len(train) == e.rows_train

    # a forced rerun commits a new data prefix and deletes the previous one, leaving nothing behind
    old_data = manifest["data"]
    again = ingest_date(
        DATE,
        layout=Layout(root, storage_options=s3),
        input=InputConfig(storage_options=s3),
        ingest=IngestConfig(rows_per_partition=1000),
        client=client,
        force=True,
    )
    final = f"ctr/pipeline/events/date={DATE}"
    new_data = json.loads(fs.cat(f"{final}/_SUCCESS.json"))["data"]
    names = sorted(p[len(final) + 1 :] for p in fs.find(final))
    parts = [f"{new_data}/part-00000-00000-0000{c}.parquet" for c in range(3)]
    assert new_data != old_data and again.parts == 3
    assert names == sorted(["_SUCCESS.json", f"{new_data}/_SUCCESS.json", *parts])
