"""What a person running `ctrpipe` reads on the terminal: one line per stage, no library chatter.

`configure` installs one handler on the root logger before Prefect or Dask are imported (both then
leave the root alone and propagate to it).  It shows:

- records logged with `extra=SHOW` (the stages' one-line summaries, through Prefect's run logger
  too) and the `ctrpipe` logger's INFO lines;
- other libraries' warnings and errors, one line each, without tracebacks;
- not Prefect's own run-engine lines (flow/task run started, finished, failed: the CLI reports the
  outcome itself), Prefect and Dask INFO lines, the comm-closed errors of a cluster shutting down, nor
  Dask's copy of a task's exception (`_REPEATS`; `pipeline.cluster.QuietWorkers` does the same in the
  worker processes of a local cluster).

`--verbose` (or `CTRPIPE_LOG_LEVEL=info|debug`) shows everything at that level, with tracebacks.
Prefect's API handler is untouched: the Prefect UI keeps the whole log either way.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

SHOW = {"ctrpipe_console": True}
"""`extra=` of a record meant for the person at the terminal (shown at INFO whatever its logger)."""
LOG_LEVEL_ENV = "CTRPIPE_LOG_LEVEL"
"""Level of the libraries' loggers (warning by default; info is `--verbose`)."""
LEVELS = ("debug", "info", "warning", "error")
_HTTP_LOGGERS = ("httpx", "httpcore")
_ENGINE_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
_CLOSED_COMM = frozenset({"CommClosedError", "StreamClosedError"})
"""Errors of a Dask comm closed under a running call: the noise of a cluster shutting down."""
_REPEATS = {
    "distributed.nanny": "Worker process still alive after",  # a clean shutdown on a busy machine: it kills the worker
    "distributed.worker": "Compute Failed",  # a task's exception, which the stage raises and the CLI reports
}
"""Library lines that say nothing the user can act on or is not told anyway (logger -> message start)."""


def level_from(verbose: bool, environ: Any = os.environ) -> int:
    """The libraries' log level: `--verbose` is INFO, else `CTRPIPE_LOG_LEVEL`, else WARNING."""
    name = (environ.get(LOG_LEVEL_ENV) or ("info" if verbose else "warning")).lower()
    if name not in LEVELS:
        raise ValueError(f"{LOG_LEVEL_ENV} must be one of {', '.join(LEVELS)}, got {name!r}")
    level = logging.getLevelName(name.upper())
    return min(level, logging.INFO) if verbose else level


def is_verbose(level: int) -> bool:
    """Whether `level` (from `level_from`) asks for the whole story: library INFO lines and tracebacks."""
    return level <= logging.INFO


def visible(record: logging.LogRecord, *, verbose: bool) -> bool:
    """Whether the console shows `record` (levels are the loggers' business; this adds the rules above)."""
    if getattr(record, "ctrpipe_console", False):
        return True
    if verbose:
        return True
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and type(exc).__name__ in _CLOSED_COMM:
        return False
    if record.name.startswith(_ENGINE_LOGGERS):
        return False
    if record.name.startswith("prefect") and record.levelno < logging.WARNING:
        return False
    start = _REPEATS.get(record.name)
    return not (start and str(record.msg).startswith(start))


class ConsoleFormatter(logging.Formatter):
    """`HH:MM:SS message` for INFO, `HH:MM:SS LEVEL logger: message` above; tracebacks only when verbose."""

    def __init__(self, *, verbose: bool) -> None:
        super().__init__(datefmt="%H:%M:%S")
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        when = self.formatTime(record, self.datefmt)
        text = record.getMessage()
        if record.levelno != logging.INFO or self.verbose:
            text = f"{record.levelname} {record.name}: {text}"
        line = f"{when} {text}"
        if self.verbose and record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class ConsoleHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at the time (a progress bar redirects it while it draws)."""

    def __init__(self, *, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose
        self.setFormatter(ConsoleFormatter(verbose=verbose))

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ assigns one; we always use sys.stderr
        pass

    def filter(self, record: logging.LogRecord) -> bool:
        return visible(record, verbose=self.verbose) and super().filter(record)


def configure(*, verbose: bool = False, environ: Any = os.environ) -> int:
    """Set up the console of this `ctrpipe` process; returns the libraries' level.

    Call before Prefect and Dask are imported: Dask's worker processes inherit the level through
    `DASK_LOGGING__DISTRIBUTED`, and neither library replaces a root handler that is already there.
    """
    level = level_from(verbose, environ)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, ConsoleHandler)]:
        root.removeHandler(handler)
    root.addHandler(ConsoleHandler(verbose=is_verbose(level)))
    root.setLevel(level)
    logging.getLogger("ctrpipe").setLevel(min(level, logging.INFO))
    for name in _HTTP_LOGGERS:  # one line per API request to Prefect: only for debug
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else max(level, logging.WARNING))
    environ.setdefault("DASK_LOGGING__DISTRIBUTED", logging.getLevelName(level).lower())
    if "distributed" in sys.modules:  # imported already: its level was read from the environment then
        logging.getLogger("distributed").setLevel(level)
    return level
