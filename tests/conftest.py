"""Shared fixtures, and the check that a test starting a process or a server says so.

Every test run gets its own temp root (TMPDIR, PREFECT_HOME) so Dask,
torchelastic and Prefect leave nothing in shared temp dirs or in `~`.

A test (or a fixture it uses) that starts a process carries one of the markers `subprocess`, `server`,
`distributed` or `chaos`, and one that listens on a socket in the test process `server` (or `distributed`,
`chaos`): `make test-fast` leaves those out.  Every run checks it: `subprocess.Popen`, `multiprocessing`'s
`Process.start` and `socket.listen` fail an unmarked test, naming the marker it needs (with
CTRPIPE_TESTS_REPORT_UNMARKED=1 the run goes on and lists them at the end).  The attention kernel's one-time
compiler run, `git rev-parse` of the code version, `uname -p`, `ldconfig -p` and the HTTP endpoint of an in-process
Dask scheduler are not processes or servers a test manages, and are let through (`INCIDENTAL`).  A test that uses a
server fixture (`prefect_api`) is marked `server` by that alone.
"""

from __future__ import annotations

import multiprocessing.process
import multiprocessing.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import slot_scenario
from tests.helpers.procs import RUN_DIR_ENV

_RUN_TMP = Path(tempfile.mkdtemp(prefix="ctrpipe-tests-"))
os.environ["TMPDIR"] = str(_RUN_TMP)
tempfile.tempdir = str(_RUN_TMP)
os.environ.setdefault(RUN_DIR_ENV, str(_RUN_TMP))  # the first process's: its xdist workers' own are inside it
os.environ.setdefault("PREFECT_HOME", str(_RUN_TMP / "prefect-home"))
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "90"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", str(_RUN_TMP / "dask"))
# Two test workers share the cores with the processes they start: an OpenMP thread that waits for work sleeps rather
# than spins (the GNU runtime's default spins first), which burned a core another test needed.  Where it runs, it
# changes when a thread waits, never what a parallel region computes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


PROCESS_MARKERS = ("subprocess", "server", "distributed", "chaos")
"""A test that starts a process carries one of these (`make test-fast` runs none of them)."""
LISTEN_MARKERS = ("server", "distributed", "chaos")
"""A test that listens on a socket in the test process (a server in a thread) carries one of these."""
INCIDENTAL = (
    "trainer.models.attention_native",
    "storage.io.version",
    "bench._results",
    "platform",
    "ctypes.util",
    "distributed.node",
)
"""Modules whose short-lived helper processes any unit test may start (the attention kernel's compiler, once per
machine; `git rev-parse` for the code version and a benchmark result's commit; the standard library's `uname -p` for
`platform.processor()` and `ldconfig -p` for `ctypes.util.find_library`), and the HTTP endpoint every Dask scheduler
opens (a cluster of threads in the test process is no server the test is about; one of processes is)."""
REPORT_UNMARKED_ENV = "CTRPIPE_TESTS_REPORT_UNMARKED"
"""=1: an unmarked test that starts a process or a server goes on, and the run lists it at the end instead (to mark
a suite's tests in one run)."""
_UNMARKED = pytest.StashKey[list[str]]()
_current: list[pytest.Item] = []
"""The test being set up, run or torn down (its fixtures' processes are its own)."""


def _unmarked(action: str, markers: tuple[str, ...]) -> None:
    """Fail the current test (raise now; the report fails too, should the caller swallow it) unless it carries one
    of `markers`."""
    if not _current:
        return
    item = _current[0]
    if any(item.get_closest_marker(m) for m in markers):
        return
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") in INCIDENTAL:
            return
        frame = frame.f_back
    names = " or ".join(f"@pytest.mark.{m}" for m in markers)
    message = f"{item.nodeid} {action} without a marker that says so: mark it (or its module) {names}"
    item.stash.setdefault(_UNMARKED, []).append(message)
    if os.environ.get(REPORT_UNMARKED_ENV) != "1":
        raise RuntimeError(message)


_popen_init = subprocess.Popen.__init__
_process_start = multiprocessing.process.BaseProcess.start
_listen = socket.socket.listen


def _guarded_popen_init(self, args, *a, **kw):  # type: ignore[no-untyped-def]
    _unmarked(
        f"starts a process ({args if isinstance(args, str) else ' '.join(map(str, args))[:200]})", PROCESS_MARKERS
    )
    _popen_init(self, args, *a, **kw)


def _guarded_process_start(self):  # type: ignore[no-untyped-def]
    _unmarked(f"starts a process ({self.name})", PROCESS_MARKERS)
    _process_start(self)


def _guarded_listen(self, *a):  # type: ignore[no-untyped-def]
    _unmarked(f"listens on {self.getsockname()}", LISTEN_MARKERS)
    _listen(self, *a)


subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]
multiprocessing.process.BaseProcess.start = _guarded_process_start  # type: ignore[method-assign]
socket.socket.listen = _guarded_listen  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    _current[:] = [item]
    try:
        return (yield)
    finally:
        _current.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # type: ignore[no-untyped-def]
    report = yield
    unmarked = item.stash.get(_UNMARKED, None)
    if unmarked and os.environ.get(REPORT_UNMARKED_ENV) == "1":
        if report.when == "teardown":
            report.user_properties.append(("unmarked", unmarked[0]))  # travels with the report from an xdist worker
    elif unmarked and report.when == "call" and report.passed:  # the error was swallowed
        report.outcome = "failed"
        report.longrepr = "\n".join(unmarked)
    return report


SERVER_FIXTURES = ("prefect_api", "prefect_in_process")
"""Fixtures that start a server: a test using one is marked `server` at collection."""


_reported: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _reported.extend(v for k, v in report.user_properties if k == "unmarked")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _reported:
        terminalreporter.section(f"{len(_reported)} tests start a process or a server unmarked")
        for line in _reported:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test using a server fixture is marked `server`; the files run heaviest first (`_weight`); the chaos suite
    (tests/chaos, `make chaos`, long) runs only when a `-m` expression names it."""
    for item in items:
        if any(f in getattr(item, "fixturenames", ()) for f in SERVER_FIXTURES):
            item.add_marker(pytest.mark.server)
    weight: dict[Path, float] = {}
    for item in items:
        weight[item.path] = weight.get(item.path, 0.0) + _weight(item)
    items.sort(key=lambda item: -weight[item.path])  # stable: each file's tests stay together and in order
    if "chaos" in (config.getoption("markexpr") or ""):
        return
    chaos = [item for item in items if item.get_closest_marker("chaos")]
    if chaos:
        config.hook.pytest_deselected(items=chaos)
        items[:] = [item for item in items if not item.get_closest_marker("chaos")]


def _weight(item: pytest.Item) -> float:
    """A rough guess of a test's seconds from its markers; `make test` hands the files to its workers heaviest
    first (`--dist loadfile --no-loadscope-reorder`).  xdist's own order, most tests first, sent the minute-long
    files of one or two tests last, where one worker ran them while the other had nothing left to do.  A test that
    reads the outcome of a scenario begun with the run (`tests.helpers.slot_scenario`) goes last: it was done by then.
    """
    if slot_scenario.FIXTURE in getattr(item, "fixturenames", ()):
        return 0.0
    if item.get_closest_marker("slow"):
        return 20.0
    if any(item.get_closest_marker(m) for m in PROCESS_MARKERS):
        return 4.0
    return 0.005


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # at exit, after multiprocessing's own finalizer (priority -100) has removed its folder in it (the fork server's
    # socket, `tests.helpers.ranks`): removed before, that finalizer would print a FileNotFoundError
    multiprocessing.util.Finalize(
        None, shutil.rmtree, args=(_RUN_TMP,), kwargs={"ignore_errors": True}, exitpriority=-200
    )


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real Criteo/Avazu samples in ../shared/data (never copied into the repo).

    Skips, saying why, in a fresh clone without the shared folder; CI always has it.
    """
    if not (SHARED_DATA / "criteo" / "train_head_10k.tsv").exists():
        pytest.skip(f"real ad-log samples not found at {SHARED_DATA} (place the shared/ folder beside the repo)")
    return SHARED_DATA


@pytest.fixture()
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api() -> str:
    """The API URL of one real `prefect server start` on 127.0.0.1 (`tests.helpers.procs.PrefectServer`), for the
    `ctrpipe` runs whose test is not about Prefect's temporary server nor needs a server of its own (restarts, kills,
    deployments): pass it as PREFECT_API_URL.  One for the whole run, both xdist workers' tests included
    (`tests.helpers.procs.shared_server`): started by the first test that asks for it, stopped when the run ends
    (`pytest_unconfigure`).  Each run keeps its own root, so their slots (`flows.prefect.slot`, keyed by root and
    model) never meet, and each test names its deployments, pools and blocks for itself."""
    from tests.helpers.procs import shared_server

    return shared_server(Path(os.environ[RUN_DIR_ENV]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that holds the killed-holder test begins its scenario now, in the background (`tests.helpers.
    slot_scenario`: its minute of waiting for a lease then overlaps the other tests)."""
    if session.config.option.collectonly:
        return
    if any(slot_scenario.FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        slot_scenario.begin(Path(os.environ[RUN_DIR_ENV]))


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's first process (xdist's controller): every worker is done
        from tests.helpers.procs import stop_shared_server

        run_dir = Path(os.environ[RUN_DIR_ENV])
        slot_scenario.stop(run_dir)
        _drain_prefect_queues()
        stop_shared_server(run_dir)


def _drain_prefect_queues() -> None:
    """Send the logs and events this process's flows left queued while the session's server still listens: Prefect
    sends them at exit otherwise, and, the server gone, retried for over a minute after a serial run's last test."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for queue in (APILogWorker, EventsWorker):
        queue.drain_all(timeout=10)


@pytest.fixture(scope="module")
def prefect_in_process(prefect_api: str) -> Iterator[str]:
    """The flows a module runs in this process report to the session's Prefect server (`prefect_api`) instead of
    an ephemeral one, which Prefect would start in this worker on its first flow and keep to the session's end
    (a second server process, its own database migrated on the way).  Only this process's settings change:
    the processes a test starts get PREFECT_API_URL from their environment, as before."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_api}):
        yield prefect_api
