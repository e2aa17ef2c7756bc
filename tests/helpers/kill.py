"""Run `ctrpipe` as a user would, in its own process group, and SIGKILL that group at a chosen moment.

A run is `ctrpipe ...` started in its own process group (a session, like a shell job).  The kill is
SIGKILL to that group.  The trainer's torchrun job runs in a session of its own (so that a timeout
can stop it with its ranks), so it outlives a kill of the group alone; `kill_tree` then kills what
is left of the run's process tree, as the loss of the node would, and says what that was.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil

from tests.helpers.procs import BIN, REPO

CTRPIPE = str(BIN / "ctrpipe")
STAGES = ("ingest", "vocab", "encode", "warm", "train", "evaluate", "publish")
_LOGGED = re.compile(r"^(\d\d:\d\d:\d\d(?:\.\d{3})?) (?:[A-Z]+ [\w.]+: )?(.*)$")
"""A line `ctrpipe` logged with CTRPIPE_LOG_LEVEL=info (`flows.cli.console`): `HH:MM:SS LEVEL logger: message`."""
_SUMMARY = re.compile(r"^(ingest|vocab|encode) (\d{4}-\d\d-\d\d):|^(warm|train|evaluate|publish):")


@dataclasses.dataclass
class Run:
    """One `ctrpipe` process (and all it started)."""

    rc: int | None
    """Exit status; None when the harness killed it."""
    seconds: float
    log: Path
    started: float
    """Wall clock (time.time) when it started."""
    survivors: tuple[str, ...] = ()
    """Processes it started outside its process group that outlived the kill of the group (their commands)."""

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def env_for(prefect_home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell: one PREFECT_HOME for every run on the machine, no Prefect server."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # CTRPIPE_LOG_LEVEL=info: Prefect's own lines too ("Beginning flow run"), which tell startup from the stages
    return {
        **env,
        "PREFECT_HOME": str(prefect_home),
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        "CTRPIPE_LOG_LEVEL": "info",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        **extra,
    }


def _start(args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, float]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [CTRPIPE, *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
        )
    return proc, time.time()


def run(args: list[str], env: dict[str, str], log: Path, *, timeout: float) -> Run:
    """Run `ctrpipe args` to the end (killed with its process group after `timeout`: rc None)."""
    proc, started = _start(args, env, log)
    t0 = time.monotonic()
    try:
        rc: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        rc = None
        kill_tree(proc)
    return Run(rc, time.monotonic() - t0, log, started)


def run_and_kill(args: list[str], env: dict[str, str], log: Path, *, after_s: float, after: str = "") -> Run:
    """Start `ctrpipe args` and SIGKILL its process group `after_s` seconds later (rc set: it ended before).

    With `after`, the seconds count from the moment the flow logs a message starting with it.
    """
    proc, started = _start(args, env, log)
    t0 = time.monotonic()
    while after and proc.poll() is None and not any(m.startswith(after) for _, m in events(Run(None, 0, log, started))):
        time.sleep(0.05)
    try:
        return Run(proc.wait(timeout=after_s), time.monotonic() - t0, log, started)
    except subprocess.TimeoutExpired:
        return Run(None, time.monotonic() - t0, log, started, kill_tree(proc))


OUTLIVE_S = 15.0
"""How long the rest of a killed run's tree may take to stop on its own before it counts as outliving it."""


def kill_tree(proc: subprocess.Popen) -> tuple[str, ...]:
    """SIGKILL `proc`'s process group, then whatever of its process tree outlived it by OUTLIVE_S; returns
    what did."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    # the job outside the group stops by itself (trainer.launch.lifetime): give it OUTLIVE_S before it counts
    psutil.wait_procs(tree, timeout=OUTLIVE_S)
    alive = [p for p in tree if _alive(p)]
    names = tuple(_command(p) for p in alive)
    for p in alive:
        try:
            os.killpg(p.pid, signal.SIGKILL) if os.getpgid(p.pid) == p.pid else p.kill()
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    psutil.wait_procs(alive, timeout=30)
    return names


def _command(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()[1:4])
    except psutil.Error:
        return "?"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def events(run_: Run) -> list[tuple[float, str]]:
    """(seconds since the run started, message) of each line the flow logged."""
    day = _dt.datetime.fromtimestamp(run_.started)
    out = []
    for line in run_.text().splitlines():
        if m := _LOGGED.match(line):
            clock = _dt.datetime.combine(day.date(), _dt.time.fromisoformat(m.group(1)))
            out.append(((clock - day).total_seconds() % 86400, m.group(2)))
    return out


def stage_at_kill(run_: Run, days: list[str]) -> str:
    """The stage the run was in when it was killed, from the stage summaries it logged ("2/3 train" for a range).

    `startup` before the flow began, `record` after the last publish (writing the day's record), `done`
    when it ended before the kill.
    """
    if run_.rc is not None:
        return "done"
    lines = [msg for _, msg in events(run_)]
    if not any(msg.startswith("Beginning flow run") for msg in lines):
        return "startup"
    day, last = 0, None
    for msg in lines:
        if not (m := _SUMMARY.match(msg)):
            continue
        stage, date = m.group(1) or m.group(3), m.group(2)
        if date is not None and date != days[min(day, len(days) - 1)]:
            continue  # a later date ingested ahead
        last = stage
        if stage == "publish":
            day, last = day + 1, None
    if day >= len(days):
        return "record"
    stage = STAGES[0] if last is None else STAGES[STAGES.index(last) + 1]
    return f"{day + 1}/{len(days)} {stage}" if len(days) > 1 else stage


def window(run_: Run, begin: str, end: str) -> tuple[float, float]:
    """Seconds since the start of `run_` of its first logged line starting with `begin` and with `end`."""
    times = events(run_)
    t0 = next(t for t, msg in times if msg.startswith(begin))
    t1 = next(t for t, msg in times if msg.startswith(end) and t >= t0)
    return t0, t1
