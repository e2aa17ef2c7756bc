"""The ranks' step hooks (`trainer.main.step_hooks`, `CTRPIPE_TRAINER_HOOKS`) and the crash tests' fault
(tests/helpers/faults.py: once per marker).  The crash and resume tests (tests/trainer/launch/test_torchrun.py,
tests/flows/day/test_run.py) run the fault in real ranks."""

from __future__ import annotations

import pytest

from tests.helpers import faults
from trainer.main import HOOKS_ENV, step_hooks
from trainer.train import StepInfo

CALLS: list[StepInfo] = []


def recording():  # a hook factory, named by module:function
    return CALLS.append


def nothing():
    return None


def test_the_hooks_are_the_factories_results_in_order_and_none_is_skipped(monkeypatch) -> None:
    monkeypatch.delenv(HOOKS_ENV, raising=False)
    assert step_hooks() == [] and step_hooks(" , ") == []
    me = __name__
    hooks = step_hooks(f"{me}:recording, {me}:nothing,{me}:recording")
    assert hooks == [CALLS.append, CALLS.append]
    monkeypatch.setenv(HOOKS_ENV, f"{me}:recording")
    assert step_hooks() == [CALLS.append]
    with pytest.raises(ValueError, match="not module:factory"):
        step_hooks("tests.helpers.faults")
    with pytest.raises(AttributeError):
        step_hooks(f"{me}:no_such_factory")


def test_the_fault_is_armed_once_per_marker_and_only_on_its_rank(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(faults.CRASH_AT_ENV, raising=False)
    assert faults.crash_at_step() is None  # no plan: no hook
    marker = tmp_path / "died.marker"
    faults.crash_once(monkeypatch, rank=1, step=3, marker=marker)
    assert [type(h) for h in step_hooks()] == [faults._CrashAt]  # what the ranks install
    first = faults.crash_at_step()
    for step in (1, 2, 3):
        first(StepInfo(rank=0, world_size=2, step=step, total_steps=9, checkpointed=False))  # another rank
    assert not marker.exists()
    first(StepInfo(rank=1, world_size=2, step=1, total_steps=9, checkpointed=False))
    assert first.armed and marker.exists()  # it would exit after step 3
    rerun = faults.crash_at_step()  # a restart or a rerun finds the marker: it trains through
    for step in (1, 2, 3, 4):
        rerun(StepInfo(rank=1, world_size=2, step=step, total_steps=9, checkpointed=step == 3))
    assert rerun.armed is False
