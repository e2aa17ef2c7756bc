"""A rank (`python -m trainer.main`) imports only what it uses: no Prefect, Dask or pipeline code, and it
starts on a host without the ingest-only ISA-L package.  Rank 0 fits the companion on every core."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from storage.embedding.config import StoreConfig
from tests.helpers.host_reads import REPO
from tests.helpers.specs import make_spec
from trainer.commit import _every_core
from trainer.main import open_store
from trainer.models.config import ModelConfig

NOT_A_RANKS = ("pipeline", "flows", "prefect", "dask", "distributed", "isal")

_PROBE = """
import json, sys
sys.modules["isal"] = None  # as on a GPU host without it: any `import isal` fails (fsspec tolerates that)
import trainer.main
print(json.dumps(sorted({m.split(".")[0] for m, mod in sys.modules.items() if mod is not None and m.split(".")[0] in
%r})))
"""


@pytest.mark.subprocess  # a fresh interpreter
def test_a_rank_imports_no_orchestration_or_ingest_package() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE % (NOT_A_RANKS,)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == [], (
        "a rank must not import them (python -X importtime -m trainer.main)"
    )


def test_rank_zeros_companion_fit_takes_every_core_and_gives_them_back() -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)  # as a rank trains (trainer.launch.torchrun.spec_env)
    try:
        with _every_core():
            assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(saved)


def test_a_ranks_store_rounds_with_the_specs_optim_seed(tmp_path) -> None:
    spec = make_spec(
        tmp_path / "features",
        tmp_path / "model",
        tmp_path / "local",
        store=StoreConfig(device_cache_rows=0, host_budget_mb=1),
        model=ModelConfig(),
        run_tag="t",
        seed=3,
    )
    store = open_store(spec, types.SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu")))
    try:
        assert spec.optim.seed == 3 and store.row_format.seed == 3
    finally:
        store.close()
