"""A run's life as an operator sees it: decided before anything starts, one run of a date at a time, and
stopped whole by SIGTERM (real `ctrpipe` processes, a real temporary Prefect server, Dask and torchrun).

The fast tests need no flow run: a run with nothing to do and the mistakes found before Prefect starts.
The slow ones start real runs on a tiny day: two of the same date at once, and one sent SIGTERM while it
trains, then rerun.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from flows.cli.exit_codes import ExitCode
from flows.day.record import DayRecord, Status, read_record, write_record
from flows.presets import demo
from pipeline.generate import generate_days
from storage.io.layout import Layout
from storage.io.registry import ModelRegistry
from tests.helpers import root_state
from tests.helpers.faults import HOLD_AT_ENV
from tests.helpers.procs import REPO
from trainer.main import HOOKS_ENV

CTRPIPE = [sys.executable, "-m", "flows.cli.main"]
DATE = "2026-01-01"
ROWS = 3000
PREFECT_STARTS = "starting a temporary Prefect server"

pytestmark = pytest.mark.subprocess  # `ctrpipe` as a user runs it


def user_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell (one PREFECT_HOME for every run), this worktree's code first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTRPIPE_", "PREFECT_LOGGING_", "DASK_"))}
    env.pop("PREFECT_API_URL", None)
    return {**env, "PREFECT_HOME": str(tmp / "prefect"), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def ctrpipe(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*CTRPIPE, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*CTRPIPE, *args], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
        )


def completed_record(date: str, version: str) -> DayRecord:
    return DayRecord(
        date=date,
        completed=True,
        status=Status.PUBLISHED,
        reason="passed the gate",
        published=True,
        model_version=version,
        latest_version=version,
        rows_read=ROWS,
        rows_ingested=ROWS,
    )


# ---- decided before anything starts ----------------------------------------------------------------
def test_a_run_whose_dates_are_all_completed_says_so_and_starts_no_prefect_server(tmp_path):
    root = tmp_path / "root"
    layout = Layout(str(root), "ctr")
    for i, date in enumerate(("2026-01-01", "2026-01-02")):
        write_record(layout, completed_record(date, f"v0000{i + 1}"))
    env = user_env(tmp_path)
    sets = ["--preset", "demo", "--set", f"root={root}", "--set", f"input.url={tmp_path}/raw/day_{{date}}.tsv.gz"]

    run = ctrpipe("run", "--date", "2026-01-02", *sets, env=env)
    assert run.returncode == ExitCode.OK, run.stderr
    assert "2026-01-02 already completed (published v00002); nothing to do" in run.stderr
    assert "2026-01-02" in run.stdout and "v00002" in run.stdout  # the day's table

    backfill = ctrpipe("backfill", "--start", "2026-01-01", "--end", "2026-01-02", *sets, env=env)
    assert backfill.returncode == ExitCode.OK, backfill.stderr
    assert "backfill: completed 0; skipped 2" in backfill.stdout
    for out in (run, backfill):
        assert PREFECT_STARTS not in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "prefect").exists()  # no Prefect server ever started: its home was never made


def test_an_input_url_without_the_date_fails_before_prefect_starts_naming_the_key(tmp_path):
    out = ctrpipe(
        "run",
        "--date",
        DATE,
        "--set",
        f"root={tmp_path / 'root'}",
        "--set",
        f"input.url={tmp_path}/raw/all.tsv",
        env=user_env(tmp_path),
    )
    assert out.returncode == ExitCode.FAILED and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("ctrpipe run: error: input.url ")
    assert "no {date}/{yyyymmdd} placeholder" in out.stderr and "put the date in the URL" in out.stderr
    assert PREFECT_STARTS not in out.stderr and not (tmp_path / "prefect").exists()


def test_a_root_that_cannot_be_written_fails_before_prefect_starts_naming_the_key_and_the_fix(tmp_path):
    root = f"/sys/ctr-data-{uuid.uuid4().hex[:8]}"  # sysfs: no one may make a folder there, root included
    out = ctrpipe("run", "--date", DATE, "--set", f"root={root}", env=user_env(tmp_path))
    assert out.returncode == ExitCode.FAILED and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith(f"ctrpipe run: error: root '{root}' is not writable: ")
    assert "--set root=DIR" in out.stderr
    assert PREFECT_STARTS not in out.stderr and not (tmp_path / "prefect").exists()


# ---- real runs -------------------------------------------------------------------------------------
@pytest.fixture()
def tiny_day(tmp_path):
    """One day of `ROWS` synthetic rows and the options of a demo run of it on `tmp_path/root`."""
    generate_days(str(tmp_path / "raw"), 1, ROWS, seed=3, start_date=DATE)
    root = tmp_path / "root"
    sets = ["--preset", "demo", "--set", f"root={root}", "--set", f"input.url={tmp_path}/raw/day_{{date}}.tsv.gz"]
    return root, sets


@pytest.mark.slow
def test_two_runs_of_the_same_date_at_once_give_one_result(tmp_path, tiny_day, prefect_api):
    root, sets = tiny_day
    # a cron run (from a worker: its own Prefect home, and the server the worker serves, here the session's) and a
    # manual retry (a user's shell: a temporary server), started together; the first one that trains waits after its
    # first step until the other has said that it waits, so that the two surely overlap
    training = tmp_path / "training"
    for home in ("cron", "manual"):
        (tmp_path / home).mkdir()
    hold = {HOOKS_ENV: "tests.helpers.faults:hold_at_step", HOLD_AT_ENV: f"1:{training}"}
    envs = [
        user_env(tmp_path / "cron", PREFECT_API_URL=prefect_api, **hold),
        user_env(tmp_path / "manual"),
    ]
    logs = [tmp_path / "cron.log", tmp_path / "manual.log"]
    procs = [start(["run", "--date", DATE, *sets], env, log) for env, log in zip(envs, logs, strict=True)]
    try:
        deadline = time.monotonic() + 900
        while not any("waiting for" in log.read_text() for log in logs):
            assert all(p.poll() is None for p in procs), "\n\n".join(log.read_text() for log in logs)
            assert time.monotonic() < deadline, "neither run waited for the other"
            time.sleep(0.2)
        training.with_name(training.name + ".release").touch()
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0], "\n\n".join(texts)
    for text in texts:
        assert "error" not in text.lower() and "Traceback" not in text, text
        assert f"{DATE}  {ROWS}" in text  # each prints the day's table
    layout = demo(str(root)).layout()
    assert ModelRegistry(layout).versions() == ["v00001"]
    record = read_record(layout, DATE)
    assert record is not None and record.completed and record.model_version == "v00001"
    # one of them waited at the date's lock for the other's run and then found the date completed
    waited = [
        t
        for t in texts
        if f"the run of {DATE} of model 'ctr' on this node" in t and f"{DATE} completed meanwhile by the run" in t
    ]
    assert len(waited) == 1, "\n\n".join(texts)
    assert root_state.leftovers(layout) == []  # no staging directory left behind


def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_sigterm_while_training_stops_every_process_in_one_line_and_the_rerun_resumes(tmp_path, tiny_day, prefect_api):
    root, sets = tiny_day
    training = tmp_path / "training"  # made by rank 0 after its second step, which then waits there
    env = user_env(tmp_path)
    args = ["run", "--date", DATE, *sets]
    proc = start(
        args,
        {**env, HOOKS_ENV: "tests.helpers.faults:hold_at_step", HOLD_AT_ENV: f"2:{training}"},
        tmp_path / "killed.log",
    )
    seen: dict[int, psutil.Process] = {}
    try:
        deadline = time.monotonic() + 600
        while not training.exists():
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()
            assert time.monotonic() < deadline, "training never started"
            seen.update({p.pid: p for p in _descendants(proc)})
            time.sleep(0.1)
        seen.update({p.pid: p for p in _descendants(proc)})
        kinds = " ".join(" ".join(_cmd(p)) for p in seen.values())
        # the demo trains one rank, which the launcher starts without torchrun (trainer.launch.torchrun.alone)
        assert "trainer.main" in kinds and "prefect.server" in kinds, kinds
        os.kill(proc.pid, signal.SIGTERM)  # as Kubernetes stops a pod: the main process only
        code = proc.wait(timeout=60)
        survivors = [" ".join(_cmd(p)) for p in psutil.wait_procs(list(seen.values()), timeout=5)[1] if _alive(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in seen.values():
            if _alive(p):
                p.kill()
    text = (tmp_path / "killed.log").read_text()
    assert code == ExitCode.INTERRUPTED, text
    assert survivors == [], survivors  # no rank, torchrun, Dask worker or Prefect server outlived the run
    lines = [line for line in text.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and lines[0].startswith(f"ctrpipe run: interrupted by SIGTERM during {DATE} train;"), text
    assert "ctrpipe run --date" in lines[0] and "again to resume" in lines[0]
    assert "Traceback" not in text, text
    layout = demo(str(root)).layout()
    assert read_record(layout, DATE) is None  # interrupted, not failed: no failed record

    # the rerun on the session's server (`prefect_api`): the killed run started a temporary one, checked above
    rerun = ctrpipe(*args, env={**env, "PREFECT_API_URL": prefect_api}, timeout=900)
    assert rerun.returncode == ExitCode.OK, rerun.stderr[-3000:]
    assert (
        f"ingest {DATE}: {ROWS} rows read = {ROWS} written + 0 quarantined + 0 dated elsewhere (already committed)"
        in rerun.stderr
    )
    assert ModelRegistry(layout).versions() == ["v00001"]


def _cmd(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
