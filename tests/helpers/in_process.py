"""Running a command's `main(argv)` in the test process, as a fresh process would run it, and putting back what it
changed in the process: a benchmark's smoke run (tests/bench/test_smoke.py), `ctrpipe` on input it refuses before
anything starts (tests/flows/cli/test_main.py)."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch


@contextmanager
def isolated(tmp: Path) -> Iterator[None]:
    """Run a command's `main` in this process as in a fresh one: TMPDIR `tmp`, and afterwards the environment,
    working folder, argv, temp folder, torch's threads, determinism and random state, numpy's and Python's random
    state, the levels and handlers of every logger that existed before, the SIGINT/SIGTERM handlers and the warning
    filters as they were."""
    environ, cwd, argv, tempdir = dict(os.environ), os.getcwd(), list(sys.argv), tempfile.tempdir
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    rng, np_rng, py_rng = torch.random.get_rng_state(), np.random.get_state(), random.getstate()
    loggers = {
        lg: (lg.level, lg.propagate, lg.disabled, list(lg.handlers))
        for lg in [logging.root, *logging.Logger.manager.loggerDict.values()]
        if isinstance(lg, logging.Logger)
    }
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os.environ["TMPDIR"] = tempfile.tempdir = str(tmp)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.argv[:], tempfile.tempdir = argv, tempdir
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.random.set_rng_state(rng)
        np.random.set_state(np_rng)
        random.setstate(py_rng)
        for lg, (level, propagate, disabled, hs) in loggers.items():
            lg.setLevel(level)
            lg.propagate, lg.disabled, lg.handlers[:] = propagate, disabled, hs
        for s, h in handlers.items():
            signal.signal(s, h)
