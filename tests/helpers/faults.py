"""The crash tests' fault: a rank that dies right after a given step, once.

`crash_once(monkeypatch, rank=R, step=S, marker=path)` installs it for the trainer ranks a test launches
(they inherit the environment): `trainer.main` installs the step hooks `CTRPIPE_TRAINER_HOOKS` names, here
`crash_at_step`, which reads its plan from `CTRPIPE_TEST_CRASH_AT` (`RANK:STEP:MARKER`).  Rank R then exits
with code 17 right after step S (after that step's checkpoint, if one is due), as a killed process would:
no cleanup, no model.  The marker makes the fault happen once: the rank creates it when it arms the
fault, and a rank that finds it already there (a torchrun restart, a rerun) trains through.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.main import HOOKS_ENV
from trainer.train import StepHook, StepInfo

if TYPE_CHECKING:
    import pytest

CRASH_AT_ENV = "CTRPIPE_TEST_CRASH_AT"
EXIT_CODE = 17

log = logging.getLogger(__name__)


def crash_once(monkeypatch: pytest.MonkeyPatch, *, rank: int, step: int, marker: Path) -> None:
    """Make `rank` of the next training run exit right after `step`, unless `marker` exists (then no fault)."""
    monkeypatch.setenv(HOOKS_ENV, f"{__name__}:crash_at_step")
    monkeypatch.setenv(CRASH_AT_ENV, f"{rank}:{step}:{marker}")


def crash_at_step() -> StepHook | None:
    """The hook factory `CTRPIPE_TRAINER_HOOKS` names: the fault `CTRPIPE_TEST_CRASH_AT` plans, or None."""
    plan = os.environ.get(CRASH_AT_ENV, "")
    if not plan:
        return None
    rank, step, marker = plan.split(":", 2)
    return _CrashAt(int(rank), int(step), Path(marker))


class _CrashAt:
    def __init__(self, rank: int, step: int, marker: Path) -> None:
        self.rank, self.step, self.marker = rank, step, marker
        self.armed: bool | None = None  # decided at the first step of the rank

    def __call__(self, info: StepInfo) -> None:
        if info.rank != self.rank:
            return
        if self.armed is None:
            self.armed = not self.marker.exists()
            if self.armed:
                self.marker.touch()
        if self.armed and info.step == self.step:
            log.error("%s: rank %d exits after step %d", CRASH_AT_ENV, info.rank, info.step)
            logging.shutdown()
            os._exit(EXIT_CODE)


HOLD_AT_ENV = "CTRPIPE_TEST_HOLD_AT"


def hold_at_step() -> StepHook | None:
    """The hook factory of a run caught while it trains: `CTRPIPE_TEST_HOLD_AT=STEP:MARKER` makes rank 0 create
    MARKER right after step STEP, then wait there (as a long training would) until the test stops it or makes
    `MARKER.release`."""
    plan = os.environ.get(HOLD_AT_ENV, "")
    if not plan:
        return None
    step, marker = plan.split(":", 1)
    return _HoldAt(int(step), Path(marker))


class _HoldAt:
    def __init__(self, step: int, marker: Path) -> None:
        self.step, self.marker = step, marker

    def __call__(self, info: StepInfo) -> None:
        if info.rank == 0 and info.step == self.step:
            self.marker.touch()
            release = self.marker.with_name(self.marker.name + ".release")
            deadline = time.monotonic() + 600
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
