"""The terminal's log: stage lines shown, library chatter and run-engine reports hidden, no tracebacks
unless verbose; the level from --verbose or CTRPIPE_LOG_LEVEL."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from flows.cli import console


def _record(
    name: str, level: int = logging.INFO, msg: str = "hello", exc: BaseException | None = None, **extra: object
) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc else None
    record = logging.getLogger(name).makeRecord(name, level, __file__, 1, msg, (), info)
    record.__dict__.update(extra)
    return record


class CommClosedError(OSError):
    """Named like distributed's: the console recognises it by name (distributed is not imported for it)."""


@pytest.mark.parametrize(
    ("record", "shown"),
    [
        (_record("prefect.flow_runs", msg="ingest: 10 rows", **console.SHOW), True),  # a stage summary
        (_record("prefect.flow_runs", msg="Beginning flow run"), False),
        (_record("prefect.task_runs", logging.ERROR, msg="Finished in state Failed"), False),  # the CLI reports it
        (_record("prefect", msg="Starting temporary server"), False),
        (_record("prefect.client", logging.WARNING, msg="cannot reach the API"), True),
        (
            _record("distributed.nanny", logging.WARNING, msg="Worker process still alive after 4.0 seconds, killing"),
            False,
        ),
        (_record("distributed.nanny", logging.WARNING, msg="Worker exceeded 95% memory budget"), True),
        (_record("distributed.worker", logging.ERROR, exc=CommClosedError("closed")), False),
        (_record("distributed.worker", logging.ERROR, msg="Compute Failed\nKey: ingest_file-1"), False),
        (_record("ctrpipe", msg="2026-01-01 already completed"), True),
        (_record("storage.warm", logging.WARNING, msg="discarding shard"), True),
    ],
)
def test_what_the_console_shows(record, shown):
    assert console.visible(record, verbose=False) is shown
    assert console.visible(record, verbose=True)  # --verbose shows everything its level lets through


def test_lines_are_short_and_tracebacks_appear_only_when_verbose():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        record = _record("storage.warm", logging.WARNING, msg="discarding shard", exc=exc)
    quiet = console.ConsoleFormatter(verbose=False).format(record)
    assert quiet.endswith(" WARNING storage.warm: discarding shard") and "\n" not in quiet
    loud = console.ConsoleFormatter(verbose=True).format(record)
    assert "Traceback" in loud and "ValueError: boom" in loud
    info = console.ConsoleFormatter(verbose=False).format(_record("ctrpipe", msg="ingest done"))
    assert len(info) == len("HH:MM:SS ingest done") and info.endswith(" ingest done")


def test_the_handler_writes_to_the_current_stderr(monkeypatch):
    handler = console.ConsoleHandler(verbose=False)
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)  # a progress bar swaps stderr while it draws
    handler.handle(_record("ctrpipe", msg="seen"))
    handler.handle(_record("prefect.flow_runs", msg="hidden"))
    assert stream.getvalue().endswith(" seen\n") and "hidden" not in stream.getvalue()


@pytest.mark.parametrize(
    ("verbose", "env", "level"),
    [
        (False, {}, logging.WARNING),
        (True, {}, logging.INFO),
        (False, {"CTRPIPE_LOG_LEVEL": "DEBUG"}, logging.DEBUG),
        (True, {"CTRPIPE_LOG_LEVEL": "error"}, logging.INFO),
    ],
)
def test_the_level_comes_from_verbose_or_the_environment(verbose, env, level):
    assert console.level_from(verbose, env) == level


def test_a_bad_level_names_the_variable():
    with pytest.raises(ValueError, match="CTRPIPE_LOG_LEVEL must be one of debug, info, warning, error, got 'loud'"):
        console.level_from(False, {"CTRPIPE_LOG_LEVEL": "loud"})


def test_configure_installs_one_handler_and_tells_dask_workers_the_level():
    root = logging.getLogger()
    saved = (
        list(root.handlers),
        root.level,
        logging.getLogger("ctrpipe").level,
        logging.getLogger("distributed").level,
        logging.getLogger("httpx").level,
    )
    env: dict[str, str] = {}
    try:
        console.configure(verbose=False, environ=env)
        console.configure(verbose=False, environ=env)  # idempotent
        assert sum(isinstance(h, console.ConsoleHandler) for h in root.handlers) == 1
        assert root.level == logging.WARNING and logging.getLogger("ctrpipe").level == logging.INFO
        assert env == {"DASK_LOGGING__DISTRIBUTED": "warning"}
        console.configure(verbose=True, environ={})
        assert root.level == logging.INFO and logging.getLogger("httpx").level == logging.WARNING  # no request log
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger("ctrpipe").setLevel(saved[2])
        logging.getLogger("distributed").setLevel(saved[3])
        logging.getLogger("httpx").setLevel(saved[4])
