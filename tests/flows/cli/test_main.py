"""`ctrpipe` as a user runs it: subprocesses, real Prefect, real files, and what it prints.

The fast tests need no flow run: help texts, usage and config errors (found before Prefect starts),
an empty registry, a closed pipe.  The command line itself, its usage exit code, a closed pipe and `generate` run as
subprocesses; the help texts and the input refused before anything starts run `flows.cli.main.main` in this process
(`here`: the same `main` a subprocess runs, its environment and what it changes in the process put back).  The slow
ones share one demo run (2 small days, on Prefect's temporary server as
a user's first run; each test gets its root as the demo left it) and check its output, the run-time failure of a
missing day (against the session's Prefect server, `prefect_api`: starting a temporary one is the demo's part),
`evaluate` and `models` on its registry (in this process, `here`).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli.exit_codes import ExitCode, help_text
from tests.helpers.cli_here import ctrpipe_here
from tests.helpers.pristine import Pristine

CTRPIPE = [sys.executable, "-m", "flows.cli.main"]
SECRET = "sekret-4f1d9c2b7e-do-not-log"
COMMANDS = (
    "demo",
    "generate",
    "run",
    "backfill",
    "evaluate",
    "models",
    "export",
    "score-server",
    "deploy",
    "serve",
    "warm-node",
)
DEMO_DAYS = ("2026-01-01", "2026-01-02")
DEMO_ROWS = 3000
SCREEN_LINES, SCREEN_WIDTH = 60, 400  # the longest: a day's train line, with its store, recipe and companion
CRITEO_SCHEMA = (
    "name: criteo_copy\ncolumns: [label, {dense}, {cat}]\nlabel: label\ninteger: [{dense}]\ncategorical: [{cat}]\n"
    "min_fields: 14\n"
).format(dense=", ".join(f"I{i}" for i in range(1, 14)), cat=", ".join(f"C{i}" for i in range(1, 27)))


def user_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of the test suite's logging or CTRPIPE settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRPIPE_", "PREFECT_LOGGING_", "DASK_"))}
    return {**env, "PREFECT_HOME": str(tmp / "prefect"), **extra}


def ctrpipe(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*CTRPIPE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def here(*args: str, env: dict[str, str], tmp: Path, capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """`ctrpipe args` with the environment `env`, in this process (`tests.helpers.cli_here.ctrpipe_here`)."""
    return ctrpipe_here(*args, tmp=tmp, capfd=capfd, env=env)


def lines_of(out: subprocess.CompletedProcess) -> list[str]:
    return (out.stdout + out.stderr).splitlines()


def assert_short_error(
    out: subprocess.CompletedProcess, *needles: str, code: int = ExitCode.FAILED, max_lines: int = 3
) -> None:
    """Exit `code`, at most `max_lines` lines on stderr, no traceback, every needle in the message."""
    err = out.stderr
    assert out.returncode == code, out.stdout + err
    assert len(err.splitlines()) <= max_lines and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


def undocumented_options(text: str) -> list[str]:
    """Options and positionals of an argparse help text with no help line (beside them or on the next line)."""
    lines = text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        m = re.match(r"^  (\S.*?)(\s{2,}\S.*)?$", line)
        if not m or line.startswith("  ctrpipe") or m.group(2):
            continue
        follows = lines[i + 1] if i + 1 < len(lines) else ""
        if not re.match(r"^ {8,}\S", follows):
            missing.append(m.group(1))
    return missing


# ---- no flow run -------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(command, tmp_path, capfd):
    out = here(command, "--help", env=user_env(tmp_path), tmp=tmp_path, capfd=capfd)
    assert out.returncode == 0, out.stderr
    description = out.stdout.split("\n\n")[1]
    assert len(description) > 60 and not description.startswith(("options:", "positional")), out.stdout
    assert "examples:\n  ctrpipe " + command in out.stdout
    assert undocumented_options(out.stdout) == []


def test_recipe_is_still_read_as_preset_but_help_names_only_preset(capsys):
    from flows.cli.parser import build_parser

    parser = build_parser()
    assert parser.parse_args(["run", "--date", "2026-01-01"]).preset == "default"
    for option in ("--preset", "--recipe"):  # --recipe: the earlier spelling (docs/user-guide.md)
        assert parser.parse_args(["models", "list", option, "demo"]).preset == "demo"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--help"])
    shown = capsys.readouterr().out
    assert "--preset NAME" in shown and "--recipe" not in shown


@pytest.mark.subprocess
def test_the_top_help_states_the_date_format_exit_codes_and_environment(tmp_path):
    out = ctrpipe("--help", env=user_env(tmp_path))
    assert out.returncode == 0
    assert "YYYY-MM-DD" in out.stdout and help_text() in out.stdout
    assert "CTRPIPE_TRACEBACK=1" in out.stdout and "CTRPIPE_LOG_LEVEL" in out.stdout
    assert all(f"    {c}" in out.stdout for c in COMMANDS)


@pytest.mark.subprocess
def test_a_command_line_argparse_cannot_read_exits_with_the_usage_code(tmp_path):
    out = ctrpipe("run", "--date", "2026-01-01", "--bogus", env=user_env(tmp_path))
    assert_short_error(out, "unrecognized arguments: --bogus", "--help", code=ExitCode.USAGE)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--date", "2026-02-30"], "not a calendar date"),
        (["run", "--date", "2026-02-01", "--set", "optim.k_steps=0"], "optim.k_steps"),
        (["run", "--date", "2026-02-01", "--set", "trainer.kk=1"], "unknown config key trainer.kk"),
        (["run", "--date", "2026-02-01", "--set", "dask.memory_limit=lots"], "dask.memory_limit must be a size"),
        (["run", "--date", "2026-02-01", "--set", "dask.address=nonsense"], "dask.address must be a scheduler address"),
        (["backfill", "--start", "2026-02-03", "--end", "2026-02-01"], "end date 2026-02-01 is before start date"),
        (["models", "show", "../../etc"], "model version"),
        (["models", "show", "latest"], "no published version under"),
        (["evaluate", "--model", "v00099", "--input", "x.tsv"], "no committed version v00099"),
        (["evaluate", "--input", "x.tsv", "--format", "shop.json"], "--format: unknown log format 'shop.json'"),
        (["demo", "--days", "0"], "--days must be at least 1, got 0"),
    ],
)
def test_bad_input_gets_a_clear_one_line_error_before_anything_starts(tmp_path, args, message, capfd):
    out = here(*args, "--set", f"root={tmp_path / 'root'}", env=user_env(tmp_path), tmp=tmp_path, capfd=capfd)
    assert_short_error(out, message, max_lines=1)
    assert "Prefect" not in out.stderr  # found before a server or a cluster started
    assert not (tmp_path / "prefect").exists()  # no Prefect server ever started: its home was never made


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            "seperator: ','\ncolumns: [a, b]\nlabel: a\ncategorical: [b]\n",
            "unknown key 'seperator' (did you mean 'separator'?)",
        ),
        ("columns: [a, b\nlabel: a\n", "not valid YAML at line 2"),
        (None, "does not exist"),
    ],
)
def test_a_schema_file_mistake_fails_before_anything_starts_naming_input_format(tmp_path, schema, message, capfd):
    path = tmp_path / "shop.yaml"
    if schema is not None:
        path.write_text(schema)
    out = here(
        "run",
        "--date",
        "2026-02-01",
        "--set",
        f"input.format={path}",
        env=user_env(tmp_path),
        tmp=tmp_path,
        capfd=capfd,
    )
    assert_short_error(out, "ctrpipe run: error: input.format: ", str(path), message, max_lines=1)
    assert not (tmp_path / "prefect").exists()  # no Prefect server ever started (nor a Dask cluster, before it)


def test_the_traceback_is_there_on_request(tmp_path, capfd):
    out = here(
        "run",
        "--date",
        "2026-02-01",
        "--set",
        "optim.k_steps=0",
        env=user_env(tmp_path, CTRPIPE_TRACEBACK="1"),
        tmp=tmp_path,
        capfd=capfd,
    )
    assert out.returncode == ExitCode.FAILED
    assert "Traceback" in out.stderr and out.stderr.rstrip().splitlines()[-1].startswith("ctrpipe run: error: ")


def test_an_empty_registry_says_where_it_looked_and_how_to_look_elsewhere(tmp_path, capfd):
    out = here(
        "models", "list", "--set", f"root={tmp_path / 'root'}", env=user_env(tmp_path), tmp=tmp_path, capfd=capfd
    )
    assert out.returncode == 0 and out.stdout == ""
    assert f"no versions of model ctr under {tmp_path / 'root' / 'models' / 'ctr'}" in out.stderr
    assert all(way in out.stderr for way in ("--config FILE", "--set root=DIR", "--preset demo"))


@pytest.mark.subprocess
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    proc = subprocess.Popen(
        [*CTRPIPE, "generate", "--out", str(tmp_path / "raw"), "--days", "3", "--rows-per-day", "500"],
        env=user_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # `| head` that has read enough
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == ExitCode.BROKEN_PIPE and err == ""


@pytest.mark.subprocess
def test_generate_is_deterministic(tmp_path):
    env = user_env(tmp_path)
    for name in ("a", "b"):
        out = ctrpipe(
            "generate", "--out", str(tmp_path / name), "--days", "2", "--rows-per-day", "500", "--seed", "5", env=env
        )
        assert out.returncode == 0, out.stderr
    for day in ("2026-01-01", "2026-01-02"):
        a, b = (gzip.decompress((tmp_path / name / f"day_{day}.tsv.gz").read_bytes()) for name in ("a", "b"))
        assert a == b and a.count(b"\n") == 500


# ---- one demo run --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built_demo_run(tmp_path_factory):
    """`ctrpipe demo` of 2 small days (a cold one and a warm one; a user's default is 3), as a user starts it, with a
    credential present in the environment; run once per module."""
    tmp = tmp_path_factory.mktemp("cli")
    env = user_env(tmp, AWS_SECRET_ACCESS_KEY=SECRET)
    root = tmp / "root"
    out = ctrpipe("demo", "--root", str(root), "--days", "2", "--rows-per-day", str(DEMO_ROWS), env=env)
    sets = ["--preset", "demo", "--set", f"root={root}"]
    return Pristine(root), (tmp, root, env, sets, out)


@pytest.fixture()
def demo_run(built_demo_run):
    """The demo's root as the demo left it: a test may move LATEST (rollback) or record a failed date."""
    pristine, run = built_demo_run
    pristine.restore()
    return run


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_demo_prints_about_a_screen_and_no_traceback(demo_run):
    _, root, _, _, out = demo_run
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = [line.replace(str(root), "ROOT") for line in lines_of(out)]  # as wide wherever the test's temp dir is
    assert len(lines) <= SCREEN_LINES and max(map(len, lines)) <= SCREEN_WIDTH, "\n".join(lines)
    text = out.stdout + out.stderr
    for noise in ("Traceback", "distributed.", "Warning", "Finished in state", "Flow run"):
        assert noise not in text, text
    for stage in ("ingest 2026-01-01:", "vocab 2026-01-01:", "encode 2026-01-01:", "warm:", "train:", "evaluate:"):
        assert re.search(re.escape(stage) + r".*\(\d+\.\ds\)$", out.stderr, re.MULTILINE), stage  # with its time
    assert "publish: v00002 is now LATEST" in out.stderr and "All days:" in out.stdout


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_completed_date_prints_its_table_and_says_so(demo_run, capfd):
    tmp, root, env, sets, _ = demo_run
    out = here("run", "--date", DEMO_DAYS[1], *sets, env=env, tmp=tmp, capfd=capfd)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(
        r"^2026-01-02\s+3000\s+0\s+\d+\s+2700\s+300\s+\d+\s+0\.\d{4}\s+0\.\d{4}\s+yes(, undecided)?\s+v00002$",
        out.stdout,
        re.MULTILINE,
    ), out.stdout
    assert "2026-01-02 already completed (published v00002); nothing to do" in out.stderr
    record = json.loads((root / "runs" / "ctr" / f"date={DEMO_DAYS[0]}" / "metrics.json").read_text())
    assert record["published"] and record["rows_read"] == DEMO_ROWS
    assert (root / "runs" / "ctr" / f"date={DEMO_DAYS[0]}" / "history.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_backfill_says_each_skipped_date_and_stops_at_a_missing_one_saying_how_to_resume(demo_run, prefect_api):
    _, _, env, sets, _ = demo_run
    out = ctrpipe(
        "backfill",
        "--start",
        DEMO_DAYS[0],
        "--end",
        "2026-01-03",
        *sets,
        "--set",
        "input.wait_s=1",  # past the preflight (which refuses a missing file at once), to the stage's own error
        env={**env, "PREFECT_API_URL": prefect_api},
    )
    skipped = re.findall(r"backfill: (\S+) already completed \(published (v\d+)\); skipped$", out.stderr, re.MULTILINE)
    assert skipped == [(d, f"v0000{i + 1}") for i, d in enumerate(DEMO_DAYS)], out.stderr
    assert out.returncode == ExitCode.FAILED and "Traceback" not in out.stderr
    error = out.stderr[out.stderr.index("ctrpipe backfill: error: ") :]
    assert error.startswith(
        "ctrpipe backfill: error: backfill 2026-01-01..2026-01-03 stopped at 2026-01-03 in ingest: "
        "FileNotFoundError: no input for 2026-01-03"
    )
    assert "skipped (done before): 2026-01-01, 2026-01-02" in error and "it resumes at 2026-01-03" in error
    table, notes = out.stdout.splitlines()[:4], out.stdout.splitlines()[4:]  # the 2 completed dates, then notes
    assert len(error.splitlines()) <= 4 and [row.split()[0] for row in table[2:]] == list(DEMO_DAYS)
    assert notes and all(re.match(r"  2026-01-02: published: undecided: ", note) for note in notes), notes


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_run_time_failure_is_two_lines_naming_the_stage_and_the_file(demo_run, prefect_api):
    _, root, env, sets, _ = demo_run
    wait = ("--set", "input.wait_s=1")  # past the preflight (which refuses a missing file at once), to the stage
    out = ctrpipe("run", "--date", "2026-01-03", *sets, *wait, env={**env, "PREFECT_API_URL": prefect_api})
    missing = root / "raw" / "day_2026-01-03.tsv.gz"
    assert_short_error(
        out,
        f"ctrpipe run: error: 2026-01-03 failed in ingest: no input for 2026-01-03 at {missing}: "
        "no file matches the input URL after waiting 1s (input.wait_s=1); check input.url",
        "--verbose",
    )
    assert out.stdout == "" and len(lines_of(out)) <= 3  # before: 119+ lines, two tracebacks, the error 4 times


@pytest.mark.slow
@pytest.mark.subprocess
def test_evaluate_scores_the_published_model_on_a_log_file(demo_run, capfd):
    tmp, root, env, sets, _ = demo_run
    day = str(root / "raw" / f"day_{DEMO_DAYS[1]}.tsv.gz")
    out = here("evaluate", "--model", "latest", "--input", day, *sets, env=env, tmp=tmp, capfd=capfd)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rows"] == DEMO_ROWS and result["model"] == "v00002"
    assert 0.6 < result["auc"] <= 1.0 and result["logloss"] > 0
    schema = tmp / "criteo_copy.yaml"
    schema.write_text(CRITEO_SCHEMA)
    again = here("evaluate", "--input", day, "--format", str(schema), *sets, env=env, tmp=tmp, capfd=capfd)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["auc"] == pytest.approx(result["auc"])  # a schema file works as --format


@pytest.mark.slow
@pytest.mark.subprocess
def test_evaluate_on_a_file_of_another_format_says_why_no_row_is_valid(demo_run, capfd):
    tmp, _, env, sets, _ = demo_run
    bad = tmp / "five_fields.tsv"
    bad.write_text("".join(f"0\t1\t2\t3\t{i}\n" for i in range(2059)))
    out = here("evaluate", "--input", str(bad), *sets, env=env, tmp=tmp, capfd=capfd)
    assert_short_error(
        out,
        "no valid rows to score, all 2059 quarantined: wrong field count x2059, "
        f"e.g. {bad} line 1: 5 fields, expected 14..40",
        "check input.format ('criteo')",
        max_lines=2,
    )


@pytest.mark.slow
@pytest.mark.subprocess
def test_models_list_show_latest_and_rollback_previous(demo_run, capfd):
    tmp, _, env, sets, _ = demo_run

    def models(*args: str) -> subprocess.CompletedProcess:
        return here("models", *args, *sets, env=env, tmp=tmp, capfd=capfd)

    out = models("list")
    assert out.returncode == 0 and out.stdout.splitlines()[-1].startswith("* v00002  published"), out.stdout
    info = json.loads(models("show", "latest", "--json").stdout)
    assert info["version"] == "v00002" and info["lineage"]["date"] == DEMO_DAYS[1]
    out = models("rollback", "previous")
    assert out.returncode == 0 and out.stdout.splitlines() == [
        "LATEST -> v00001 (was v00002)",
        "servers -> v00001 (bundles/ctr/LATEST)",
    ], out.stdout
    out = models("rollback", "v00002")
    assert out.stdout.splitlines()[0] == "LATEST -> v00002 (was v00001)"
    assert json.loads(models("show", "latest", "--json").stdout)["version"] == "v00002"


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_credential_in_the_environment_appears_in_no_output_or_file(demo_run):
    tmp, _, _, _, out = demo_run
    assert SECRET not in out.stdout and SECRET not in out.stderr
    for path in Path(tmp).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path  # includes Prefect's database (artifacts, logs)
