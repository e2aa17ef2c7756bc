"""A run's input is checked before Prefect starts (issue 52): a missing file, or lines the schema does not read, are
reported naming the file, and no temporary Prefect server (nor its home) is started for them; an input that
`input.wait_s` waits for is not refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli.exit_codes import ExitCode
from pipeline.generate import generate_days
from tests.helpers.in_process import isolated
from tests.helpers.procs import REPO

PREFECT_STARTS = "starting a temporary Prefect server"


class ServerWouldStart(BaseException):
    """Raised where `ctrpipe` would set up Prefect: the checks before it all passed (no `except Exception` takes it)."""


def run_here(tmp: Path, monkeypatch, capfd, *args: str) -> tuple[int, str]:
    """`ctrpipe args` in this process, stopped where Prefect would start: (exit code, stderr)."""
    from flows.cli import run_commands
    from flows.cli.main import main

    def no_server(*_a, **_k):
        raise ServerWouldStart("prefect_defaults called")

    monkeypatch.setattr(run_commands, "prefect_defaults", no_server)
    capfd.readouterr()
    with isolated(tmp):
        code = main(list(args))
    return code, capfd.readouterr().err


def sets(tmp: Path, *extra: str) -> list[str]:
    url = f"{tmp}/raw/day_{{date}}.tsv.gz"
    return ["--preset", "demo", "--set", f"root={tmp / 'root'}", "--set", f"input.url={url}", *extra]


def test_a_missing_input_fails_naming_the_file_before_prefect_starts(tmp_path, monkeypatch, capfd):
    code, err = run_here(tmp_path, monkeypatch, capfd, "run", "--date", "2026-01-01", *sets(tmp_path))
    missing = tmp_path / "raw" / "day_2026-01-01.tsv.gz"
    assert code == ExitCode.FAILED and "prefect_defaults" not in err, err
    assert err.startswith(f"ctrpipe run: error: no input for 2026-01-01 at {missing}: no file matches the input URL")
    assert "set input.wait_s when the input lands late" in err


def test_a_backfill_names_the_first_date_without_input_before_prefect_starts(tmp_path, monkeypatch, capfd):
    generate_days(str(tmp_path / "raw"), 2, 200, seed=1, start_date="2026-01-01")
    args = ["backfill", "--start", "2026-01-01", "--end", "2026-01-03", *sets(tmp_path)]
    code, err = run_here(tmp_path, monkeypatch, capfd, *args)
    assert code == ExitCode.FAILED and "no input for 2026-01-03 at " in err and "day_2026-01-03.tsv.gz" in err, err


def test_an_input_waited_for_is_not_refused_and_a_present_one_passes(tmp_path, monkeypatch, capfd):
    late = sets(tmp_path, "--set", "input.wait_s=600")
    with pytest.raises(ServerWouldStart):
        run_here(tmp_path, monkeypatch, capfd, "run", "--date", "2026-01-01", *late)
    generate_days(str(tmp_path / "raw"), 1, 200, seed=1, start_date="2026-01-01")
    with pytest.raises(ServerWouldStart):
        run_here(tmp_path, monkeypatch, capfd, "run", "--date", "2026-01-01", *sets(tmp_path))


def test_lines_the_schema_does_not_read_fail_with_the_reasons_before_prefect_starts(tmp_path, monkeypatch, capfd):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "day_2026-01-01.csv").write_text("".join(f"2026-01-01 00:00:{i:02d},1,a\n" for i in range(30)))
    schema = tmp_path / "s.yaml"
    schema.write_text(
        "separator: ','\ncolumns: [ts, y, c]\nlabel: y\ncategorical: [c]\ntimestamp: {column: ts, format: unix}\n"
    )
    args = ["--set", f"input.url={tmp_path}/raw/day_{{date}}.csv", "--set", f"input.format={schema}"]
    code, err = run_here(tmp_path, monkeypatch, capfd, "run", "--date", "2026-01-01", *sets(tmp_path), *args)
    assert code == ExitCode.FAILED, err
    assert "30 rows read = 0 valid + 30 quarantined (100.00%) + 0 dated elsewhere" in err
    assert "bad timestamp x30" in err and "fix timestamp.format in the schema file" in err


@pytest.mark.subprocess
def test_ctrpipe_run_of_a_missing_file_starts_no_prefect_server_nor_its_home(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRPIPE_", "PREFECT_", "DASK_"))}
    env = {**env, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "flows.cli.main", "run", "--date", "2026-01-01", *sets(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    missing = tmp_path / "raw" / "day_2026-01-01.tsv.gz"
    assert out.returncode == ExitCode.FAILED and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"ctrpipe run: error: no input for 2026-01-01 at {missing}: ")
    assert PREFECT_STARTS not in out.stderr and not (tmp_path / "prefect").exists()


def test_a_truncated_input_fails_naming_the_file_before_prefect_starts(tmp_path, monkeypatch, capfd):
    generate_days(str(tmp_path / "raw"), 1, 2000, seed=1, start_date="2026-01-01")
    day = tmp_path / "raw" / "day_2026-01-01.tsv.gz"
    day.write_bytes(day.read_bytes()[:-1000])
    code, err = run_here(tmp_path, monkeypatch, capfd, "run", "--date", "2026-01-01", *sets(tmp_path))
    assert code == ExitCode.FAILED, err
    assert err.startswith(f"ctrpipe run: error: {day}: cannot decompress (gzip): ") and "truncated" in err
