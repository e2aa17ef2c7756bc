"""flows.day.state.DayState: each stage's result through its typed accessor; a stage not run yet fails naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.day.state import RESULTS, DayState
from pipeline.encode.stage import EncodeResult
from storage.io.layout import Layout

DATE = "2026-01-05"


def _state(tmp_path: Path) -> DayState:
    return DayState(date=DATE, layout=Layout(str(tmp_path)))


def test_a_result_added_is_read_back_typed(tmp_path: Path) -> None:
    encoded = EncodeResult(date=DATE, rows_train=9, rows_eval=1, skipped=False)
    state = _state(tmp_path).with_result("encode", encoded)
    assert state.encode is encoded and state.encode.rows_train == 9


@pytest.mark.parametrize("name", RESULTS)
def test_a_stage_not_run_yet_names_itself(tmp_path: Path, name: str) -> None:
    with pytest.raises(RuntimeError, match=f"the {name} stage of {DATE} has not run; run_day runs the stages in order"):
        getattr(_state(tmp_path), name)


def test_every_result_has_an_accessor(tmp_path: Path) -> None:
    state = _state(tmp_path)
    for name in RESULTS:
        assert getattr(state.with_result(name, object()), name) is not None


def test_with_result_refuses_a_name_that_is_no_stage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no stage result named 'evaluate'"):
        _state(tmp_path).with_result("evaluate", object())  # the stage is `evaluate`, its result `evaluation`


def test_adding_a_result_leaves_the_state_it_came_from_unchanged(tmp_path: Path) -> None:
    before = _state(tmp_path)
    before.with_result("warm", object())
    with pytest.raises(RuntimeError, match="warm stage"):
        _ = before.warm
