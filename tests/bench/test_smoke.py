"""Every benchmark runs: `bench.<name>.main(["--smoke"])` returns and writes its results.

A benchmark is a script no other test imports, so without this one it breaks silently (bench.train,
bench.comm and bench.het failed at their first line of data for weeks).  Each runs at its smoke size
(seconds of work) into its own results folder ($BENCH_RESULTS_DIR); the checks are on the keys and
the rows each one must report, never on its numbers' size, which mean nothing at that size.

Each runs in the test process (`python -m bench.<name>` is that `main` and one line), with whatever it changes
in the process put back afterwards (`isolated`); what a benchmark measures in processes of its own (torchrun, a
server, `ctrpipe backfill`) it still starts itself.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.__main__ import SMOKE
from bench._common import RESULTS_ENV
from tests.helpers.in_process import isolated

REPO = Path(__file__).resolve().parents[2]
HELPERS = {"quality_bound", "quality_data", "quality_peers", "quality_product", "quality_rolling", "quality_stats"}
"""Modules of bench/ that are not commands (nor are `_*` ones)."""
SHARED_DATA = {"bench.quality", "bench.quality_ladder", "bench.rare_positives"}
"""Smoke runs on the real samples of ../shared/data (the `shared_data` fixture skips, saying why, without them)."""


def run_smoke(
    name: str, results: Path, tmp: Path, capfd: pytest.CaptureFixture[str], env: dict[str, str] | None = None
) -> str:
    """`name`'s `main(["--smoke"])` in this process (`isolated`), with `env` set: its stdout."""
    main = importlib.import_module(name).main
    with isolated(tmp):
        os.environ.update({RESULTS_ENV: str(results), **(env or {})})
        # one torch thread, as every rank has: beside the other test worker a second intra-op thread only waits
        torch.set_num_threads(1)
        code = main(["--smoke"])
    assert code in (None, 0), f"{name}.main(['--smoke']) returned {code}"
    return capfd.readouterr().out


def load(results: Path, name: str) -> dict[str, Any]:
    path = results / f"{name}.json"
    assert path.exists(), f"{path} not written (have {sorted(p.name for p in results.glob('*'))})"
    data = json.loads(path.read_text())
    assert "environment" in data or name == "gpu_probe", f"{name}.json lacks the machine and versions"
    return data


def runs(data: dict[str, Any], key: str = "rows") -> dict[str, dict[str, Any]]:
    return {r["run"]: r for r in data[key]}


def check_ingest(out: str, results: Path) -> None:
    data = load(results, "ingest")
    got = runs(data, "results")
    for name in ("reference 4 x gzip", "project 4 x gzip", "project 1 x plain"):
        assert got[name]["rows"] == 20_000 and got[name]["rows_per_s"] > 0, got.keys()
    assert data["task_peaks"][0]["rows_per_file"] == 5_000


def check_vocab(out: str, results: Path) -> None:
    got = runs(load(results, "vocab"))
    assert {"chain: 2 daily builds", "incremental update of the last day", "window re-merge of the last day"} <= set(
        got
    )
    assert got["incremental update of the last day"]["keys_in_window"] > 0


def check_store(out: str, results: Path) -> None:
    for part in ("index", "host", "ssd", "hitrate", "hitrate_bytes", "scale"):
        assert load(results, f"store_{part}")["rows"], part
    assert load(results, "store_scale")["rows"][0]["keys"] == 10**4


def check_train(out: str, results: Path) -> None:
    data = load(results, "train")
    got = runs(data)
    assert data["params"]["flops_per_example"] > data["params"]["forward_flops_per_example"] > 0
    assert data["params"]["attainable_gflops"] > 0 and data["params"]["recipe"]["values"]["optim.batch_size"] > 0
    for name in ("ours w1", "plain torch", "plain torch fresh"):
        assert got[name]["examples_per_s"] > 0 and got[name]["mfu"] > 0, (name, got[name])
        assert got[name]["steps"] == data["params"]["recipe"]["steps"]  # the recipe's steps for every loop
    trec = got["torchrec EBC"]
    assert trec.get("examples_per_s", 0) > 0 or trec["note"].startswith("skipped: torchrec not importable")
    assert "mfu" in out and "MFLOP/example" in out


def check_dense_step(out: str, results: Path) -> None:
    got = runs(load(results, "dense_step"))
    plain, kernel = got["2,000 rows: plain formulation (autograd)"], got["2,000 rows: attention CPU kernel"]
    tokens = got["2,000 rows: attention CPU kernel [model.attention_input=tokens]"]  # the smoke run's one variant
    assert plain["speedup_vs_plain"] == 1.0 and kernel["speedup_vs_plain"] > 0 and kernel["speedup_vs_default"] == 1.0
    assert (
        tokens["speedup_vs_default"] > 0 and tokens["mflop_per_example"] > kernel["mflop_per_example"]
    )  # 39 tokens attend
    ops = got["2,000 rows: attention torch-ops kernel"]  # the compiled kernel's fallback, timed beside it
    assert ops["speedup_vs_default"] > 0 and ops["mflop_per_example"] == kernel["mflop_per_example"]
    for row in (plain, kernel, tokens, ops):
        assert row["batch"] == 128 and row["ms_per_step"] > 0 and row["mfu"] > 0, row  # the recipe's smallest batch
        assert row["mfu_best"] >= row["mfu"], row  # the fastest round against the median
        assert row["mflop_per_example"] > 0 and row["matmul_shape"].startswith("128x")


def check_comm(out: str, results: Path) -> None:
    assert load(results, "comm_allreduce")["rows"][0]["two_phase_ms"] > 0
    k = load(results, "comm_kstep")["rows"]
    assert [r["k"] for r in k] == [2] and k[0]["steps"] == 4 and 0 <= k[0]["auc"] <= 1


def check_het(out: str, results: Path) -> None:
    rows = load(results, "het")["rows"]
    assert [(r["procs"], r["bound"]) for r in rows] == [(2, 0), (2, 1)]
    assert rows[0]["bytes_vs_b0"] == 1.0 and rows[1]["sparse_KB_per_step"] > 0


def check_day(out: str, results: Path) -> None:
    data = load(results, "day")
    days = data["runs"]["3000"]["days"]
    assert [d["day"] for d in days] == [1, 2] and all(d["train_mfu"] > 0 for d in days)
    assert data["reference"]["3000"]["loop_mfu"] > 0
    assert "train mfu" in out


def check_bigday(out: str, results: Path) -> None:
    data = load(results, "bigday")
    bounded, unbounded = data["rows"]
    assert bounded["budget_mib"] == 1 and unbounded["budget_mib"] > bounded["budget_mib"], data["rows"]
    for row in (bounded, unbounded):
        assert row["examples_per_s"] > 0 and 0 < row["auc"] < 1 and 0 < row["host_hit_rate"] <= 1, row
        assert row["rank_peak_rss_mib"] > 0 and row["ssd_wait_share"] >= 0, row
    assert unbounded["vs_unbounded"] == 1.0 and data["day"]["repeated"] > 0
    # the pair is the last day's (the smoke's one cold day: `warm_rows` 0); every day of each root is in `runs`
    assert bounded["day"] == unbounded["day"] == 1 and bounded["warm_rows"] == unbounded["warm_rows"] == 0
    assert [r["run"].split(", ")[1] for r in data["runs"]] == ["day 1 (cold)"] * 2, data["runs"]
    assert data["disk"]["reads_per_s"] > 0 and data["disk"]["queue_depth"] >= 1
    assert "random 4 KiB reads/s" in out


def check_serve(out: str, results: Path) -> None:
    rows = load(results, "serve")["rows"]
    http = [r for r in rows if r["part"] == "http"]
    assert {(r["batch"], r["clients"]) for r in http} == {(1, 1), (1, 4), (32, 1), (32, 4)}, http
    assert all(r["failed"] == 0 and r["rows_s"] > 0 for r in http)
    assert {r["part"] for r in rows} == {"in-process", "http", "reload", "size", "memory"}
    assert [r["switched"] for r in rows if r["part"] == "reload"] == [True]


def check_quality(out: str, results: Path) -> None:
    from bench.quality_rolling import SMOKE as ROLLING_SMOKE

    criteo = load(results, "quality")["datasets"]["criteo"]
    split = criteo["split"]
    assert split["rows_per_day"] == [1_100] * ROLLING_SMOKE.days and split["origins"] == [1, 2]
    assert split["pooled_rows"] == 2_200  # days 2 and 3: every row after the first day is scored once
    rows = {r["model"]: r for r in criteo["rows"]}
    for peer in ("sklearn-lr", "sklearn-poly2", "deepctr-deepfm"):
        assert peer in rows or (peer in criteo["skipped"] and f"{peer} skipped" in out)  # run, or skipped: why
    if "sklearn-poly2" in rows:
        assert len(criteo["peers"]["sklearn-poly2"]["C_per_origin"]) == 2
    # this project's Poly2 and the probe need no peer package: always there; each C from the smoke's grid
    assert len(criteo["peers"]["poly2"]["C_per_origin"]) == 2
    assert set(criteo["peers"]["poly2"]["C_per_origin"]) <= set(ROLLING_SMOKE.poly2_cs or ())
    assert rows["probe: attention + poly2"]["seeds"] == rows["attention"]["seeds"]
    assert {"attention", "lr", "poly2"} <= set(rows)
    assert rows["attention"]["train_s"] > 0 and "train_s" not in rows.get("sklearn-lr", {})  # the product's cost only
    for model, r in rows.items():
        assert 0.55 < r["auc"] < 0.9 and len(r["auc_per_origin"]) == 2
        if model != "attention":
            # the results file keeps 6 significant digits of each (bench._results)
            assert 0 < r["vs_sd"] < 0.05 and r["vs_default"] == pytest.approx(
                r["auc"] - rows["attention"]["auc"], abs=2e-6
            )
    days = criteo["days"]["attention"][0]
    assert days[0]["status"] == "published" and days[1]["rows_carried"] > 0  # day 2 trains day 1's eval rows


def check_quality_ladder(out: str, results: Path) -> None:
    rows = load(results, "quality-ladder")["rows"]
    assert [r["setting"][0] for r in rows] == list("123456") and {r["dataset"] for r in rows} == {"criteo"}
    assert all(0.5 < r["lr 0.023"] < 0.9 for r in rows), rows


def check_rare_positives(out: str, results: Path) -> None:
    rows = {r["keep_rate"]: r for r in load(results, "rare_positives")["rows"]}
    assert set(rows) == {1.0, 0.25} and rows[1.0]["auc_vs_1"] == 0.0
    assert rows[0.25]["examples"] < rows[1.0]["examples"] and rows[1.0]["uncorrected"] == rows[1.0]["calibration"]
    assert rows[0.25]["uncorrected"] > rows[0.25]["calibration"] > 0  # the correction lowers every score


def check_gpu_probe(out: str, results: Path) -> None:
    probe = load(results, "gpu_probe")
    assert probe["device"] == "cpu" and probe["world"]["status"] == probe["phases"]["status"] == "ok", probe
    assert probe["nccl"]["status"] == "skipped: no CUDA"
    assert probe["sync_free_step"]["status"] == "ok" and probe["sync_free_step"]["sync_debug"] == "n/a (CPU)"


def check_capacity(out: str, results: Path) -> None:
    data = load(results, "capacity")
    assert {"Criteo-1TB day", "Baidu-sized key space"} == {r["scenario"] for r in data["rows"]}
    assert data["inputs"]["cpu_rank_examples_per_s"]["value"] > 0
    assert "| stage | what |" in out


CHECKS: dict[str, Callable[[str, Path], None]] = {
    "bench.ingest": check_ingest,
    "bench.vocab": check_vocab,
    "bench.store": check_store,
    "bench.train": check_train,
    "bench.dense_step": check_dense_step,
    "bench.comm": check_comm,
    "bench.het": check_het,
    "bench.day": check_day,
    "bench.bigday": check_bigday,
    "bench.gpu_probe": check_gpu_probe,
    "bench.capacity": check_capacity,
    "bench.serve": check_serve,
    "bench.quality": check_quality,
    "bench.quality_ladder": check_quality_ladder,
    "bench.rare_positives": check_rare_positives,
}
MARKS = {
    "bench.ingest": [pytest.mark.server],  # a Dask cluster of worker processes, a fresh process per memory reading
    "bench.vocab": [pytest.mark.server],  # a Dask cluster of worker processes
    "bench.store": [pytest.mark.subprocess],  # a fresh process per memory reading
    "bench.train": [pytest.mark.distributed],
    "bench.comm": [pytest.mark.distributed],
    "bench.het": [pytest.mark.distributed],
    # `ctrpipe backfill` (Dask, torchrun) for 2 days against the session's Prefect server: a minute or more
    "bench.day": [pytest.mark.slow, pytest.mark.server],
    "bench.bigday": [pytest.mark.slow, pytest.mark.server],  # `ctrpipe generate`, then `ctrpipe backfill` twice
    "bench.serve": [pytest.mark.server],  # `ctrpipe score-server`
    "bench.quality": [pytest.mark.slow, pytest.mark.server],  # 2 archs x 3 days through the flow, and the peers
    "bench.rare_positives": [pytest.mark.slow, pytest.mark.server],  # 2 days through the flow: about a minute
}
PREFECT_API = {"bench.day", "bench.bigday"}
"""Smoke runs whose `ctrpipe` talks to the session's Prefect server (`prefect_api`) rather than starting a temporary
one: which server a run reports to is no part of what the benchmark measures, at a smoke size least of all."""


DAYS = ("bench.quality", "bench.day", "bench.bigday", "bench.rare_positives")
"""The smoke runs that train days through the flow, a minute each: tests/bench/test_smoke_days.py runs them, a file
of their own, so that `--dist loadfile` can give them to another worker than the rest of this file's."""


def params(names: list[str] | tuple[str, ...]) -> list[Any]:
    return [pytest.param(n, marks=MARKS.get(n, [])) for n in names]


@pytest.mark.parametrize("name", params([n for n in SMOKE if n not in DAYS]))
def test_the_benchmark_runs_at_its_smoke_size_and_writes_its_results(
    name: str, tmp_path: Path, request: pytest.FixtureRequest, capfd: pytest.CaptureFixture[str]
) -> None:
    smoke(name, tmp_path, request, capfd)


def smoke(name: str, tmp_path: Path, request: pytest.FixtureRequest, capfd: pytest.CaptureFixture[str]) -> None:
    """`name`'s smoke run in this process, into a results folder of its own, and its checks (`CHECKS`)."""
    if name in SHARED_DATA:
        request.getfixturevalue("shared_data")
    if name == "bench.quality_ladder":
        pytest.importorskip("sklearn", reason="bench.quality_ladder hashes with scikit-learn: pip install '.[test]'")
    env = {"PREFECT_API_URL": request.getfixturevalue("prefect_api")} if name in PREFECT_API else {}
    results = tmp_path / "results"
    (tmp_path / "tmp").mkdir()
    out = run_smoke(name, results, tmp_path / "tmp", capfd, env)
    CHECKS[name](out, results)


def test_every_benchmark_command_has_a_smoke_size_that_python_m_bench_smoke_runs() -> None:
    commands = {p.stem for p in (REPO / "bench").glob("*.py") if not p.stem.startswith("_") and p.stem not in HELPERS}
    with_smoke = {c for c in commands if "add_smoke(" in (REPO / "bench" / f"{c}.py").read_text()}
    assert with_smoke == commands
    assert set(SMOKE) == {f"bench.{c}" for c in with_smoke} == set(CHECKS)
    assert set(DAYS) <= set(SMOKE)  # each smoke runs in one of the two files
    assert SMOKE[-1] == "bench.capacity"  # it reads the others' results
