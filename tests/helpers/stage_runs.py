"""Ingest, vocab and encode of one date in a row: in this process, or in a child process a test can kill.

The crash tests run the same stages uninterrupted (the reference) and in a
child they SIGKILL mid-write; `stage_command` is that child's command line and
carries the configs as JSON, so both runs are configured alike.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

from distributed import Client, LocalCluster

from pipeline.config import EncodeConfig, IngestConfig, InputConfig, VocabConfig
from pipeline.encode.stage import EncodeResult, encode_date
from pipeline.ingest.stage import IngestResult, ingest_date
from pipeline.vocab.stage import VocabResult, build_vocab
from storage.io.layout import Layout


@dataclass(frozen=True, kw_only=True)
class StageConfigs:
    input: InputConfig = field(default_factory=InputConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)

    @staticmethod
    def from_dict(d: dict) -> StageConfigs:
        return StageConfigs(
            input=InputConfig(**d["input"]), ingest=IngestConfig(**d["ingest"]), vocab=VocabConfig(**d["vocab"])
        )


class StageResults(NamedTuple):
    ingest: IngestResult
    vocab: VocabResult
    encode: EncodeResult


def run_stages(date: str, *, layout: Layout, client: Client, configs: StageConfigs) -> StageResults:
    """The three data stages of `date` (criteo format) under `layout`."""
    kw = {"layout": layout, "client": client}
    i = ingest_date(date, input=configs.input, ingest=configs.ingest, **kw)
    v = build_vocab(date, vocab=configs.vocab, fmt="criteo", **kw)
    e = encode_date(date, encode=EncodeConfig(), fmt="criteo", **kw)
    return StageResults(i, v, e)


def stage_command(date: str, *, root: str, configs: StageConfigs, storage_options: dict | None = None) -> list[str]:
    """The command line of a child process that runs `run_stages` on its own in-process LocalCluster.

    Run it from the repository root (or with it on PYTHONPATH): it imports `tests`.
    """
    spec = {"date": date, "root": root, "storage_options": storage_options, "configs": asdict(configs)}
    return [sys.executable, "-m", "tests.helpers.stage_runs", json.dumps(spec)]


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    layout = Layout(spec["root"], storage_options=spec["storage_options"])
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        run_stages(spec["date"], layout=layout, client=client, configs=StageConfigs.from_dict(spec["configs"]))


if __name__ == "__main__":
    main(sys.argv[1:])
