"""`ctrpipe` as a user runs it: subprocesses, real Prefect (ephemeral), real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.generate import generate_days

pytestmark = pytest.mark.slow
CTRPIPE = [sys.executable, "-m", "flows.cli"]
SECRET = "sekret-4f1d9c2b7e-do-not-log"


def ctrpipe(*args: str, env: dict[str, str], timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([*CTRPIPE, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def day_run(tmp_path_factory):
    """One generated day run through `ctrpipe run`, with a credential present in the environment."""
    tmp = tmp_path_factory.mktemp("cli")
    generate_days(str(tmp / "raw"), 1, 4000, seed=3, start_date="2026-02-01")
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect"), "AWS_SECRET_ACCESS_KEY": SECRET,
           "PREFECT_LOGGING_LEVEL": "INFO"}
    sets = ["--recipe", "demo", "--set", f"root={tmp / 'root'}", "--set", f"input.url={tmp / 'raw'}/day_{{date}}.tsv.gz",
            "--set", "dask.processes=false"]
    out = ctrpipe("run", "--date", "2026-02-01", *sets, env=env)
    return tmp, env, sets, out


def test_run_prints_the_day_table_and_publishes(day_run):
    tmp, _, _, out = day_run
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2026-02-01" in out.stdout and "v00001" in out.stdout and "yes" in out.stdout
    record = json.loads((tmp / "root" / "runs" / "ctr" / "date=2026-02-01" / "metrics.json").read_text())
    assert record["published"] and record["rows_read"] == 4000
    assert (tmp / "root" / "runs" / "ctr" / "date=2026-02-01" / "history.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_scores_the_published_model_on_a_log_file(day_run):
    tmp, env, sets, _ = day_run
    out = ctrpipe("evaluate", "--model", "latest", "--input", str(tmp / "raw" / "day_2026-02-01.tsv.gz"),
                  *sets, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rows"] == 4000 and result["model"] == "v00001"
    assert 0.6 < result["auc"] <= 1.0 and result["logloss"] > 0


def test_models_list_and_show(day_run):
    tmp, env, sets, _ = day_run
    out = ctrpipe("models", "list", *sets, env=env)
    assert out.returncode == 0 and out.stdout.startswith("* v00001  published"), out.stdout + out.stderr
    out = ctrpipe("models", "show", "v00001", *sets, env=env)
    info = json.loads(out.stdout)
    assert info["status"] == "published" and info["lineage"]["date"] == "2026-02-01"


def test_a_credential_in_the_environment_appears_in_no_output_or_file(day_run):
    tmp, _, _, out = day_run
    assert SECRET not in out.stdout and SECRET not in out.stderr
    for path in Path(tmp).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path  # includes Prefect's database (artifacts, logs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--date", "2026-02-30"], "not a calendar date"),
        (["run", "--date", "2026-02-01", "--set", "optim.k_steps=0"], "optim.k_steps"),
        (["run", "--date", "2026-02-01", "--set", "trainer.kk=1"], "unknown config key trainer.kk"),
        (["models", "show", "../../etc"], "model version"),
        (["evaluate", "--model", "v00099", "--input", "x.tsv"], "v00099"),
    ],
)
def test_bad_input_gets_a_clear_one_line_error(day_run, args, message):
    _, env, sets, _ = day_run
    out = ctrpipe(*args, *sets, env=env)
    assert out.returncode == 1
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_generate_is_deterministic(tmp_path):
    env = {**os.environ}
    for name in ("a", "b"):
        out = ctrpipe("generate", "--out", str(tmp_path / name), "--days", "2", "--rows-per-day", "500",
                      "--seed", "5", env=env)
        assert out.returncode == 0, out.stderr
    import gzip

    for day in ("2026-01-01", "2026-01-02"):
        a = gzip.open(tmp_path / "a" / f"day_{day}.tsv.gz").read()
        b = gzip.open(tmp_path / "b" / f"day_{day}.tsv.gz").read()
        assert a == b and a.count(b"\n") == 500
