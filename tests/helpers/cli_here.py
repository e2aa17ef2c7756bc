"""`ctrpipe ARGS` run in the test process, for the tests that read what a command prints (exports, `models`,
`evaluate`) and are not about the process itself (exit on a signal, the console of a child: tests/flows/cli).
A fresh `ctrpipe` process spends seconds importing torch, Prefect and Dask before it starts; this one has them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.in_process import isolated


def ctrpipe_here(
    *args: str, tmp: Path, capfd: pytest.CaptureFixture[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`ctrpipe args` as a `ctrpipe` process would run it (with the environment `env`, else this process's), here:
    its exit code, stdout and stderr, as `subprocess.run(..., capture_output=True, text=True)` gives them.  What the
    command changes in this process is put back (`tests.helpers.in_process.isolated`)."""
    from flows.cli.main import main

    capfd.readouterr()
    with isolated(tmp):
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help, or a command line it cannot read
            code = exc.code
    out = capfd.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)
