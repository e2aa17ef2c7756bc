"""Waiting for a late input: polled until the files (and the done marker) are there, or a clear error."""

import logging

import pytest

from pipeline.config import InputConfig
from pipeline.ingest.input_wait import done_marker_url, wait_for_input


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def test_the_input_is_waited_for_and_each_poll_says_what_is_missing(caplog):
    clock, calls = Clock(), []

    def find():
        calls.append(clock.now)
        return [{"url": "x"}] if clock.now >= 30 else []

    with caplog.at_level(logging.INFO, logger="ctrpipe"):
        got = wait_for_input(
            find,
            url="/d/day.tsv",
            date="2026-01-01",
            input=InputConfig(wait_s=60, poll_s=10),
            clock=clock,
            sleep=clock.sleep,
        )
    assert got == [{"url": "x"}] and calls == [0, 10, 20, 30]
    assert sum("waiting for no file matches" in r.message for r in caplog.records) == 3


def test_no_input_after_the_wait_names_what_and_how_long():
    clock = Clock()
    with pytest.raises(FileNotFoundError, match=r"no input for 2026-01-01 at /d/day.tsv: no file .* after waiting 60s"):
        wait_for_input(
            lambda: [],
            url="/d/day.tsv",
            date="2026-01-01",
            input=InputConfig(wait_s=60, poll_s=25),
            clock=clock,
            sleep=clock.sleep,
        )
    assert clock.now == 60  # the last poll is at the deadline, not past it


def test_without_a_wait_a_missing_input_fails_at_once():
    with pytest.raises(FileNotFoundError, match="no input for 2026-01-01 at /d/x"):
        wait_for_input(lambda: [], url="/d/x", date="2026-01-01", input=InputConfig())


def test_with_a_done_file_the_files_alone_are_not_enough(tmp_path):
    (tmp_path / "day.tsv").write_text("1\n")
    clock = Clock()

    def sleep(s):
        clock.sleep(s)
        (tmp_path / "_SUCCESS").touch()

    cfg = InputConfig(wait_s=30, poll_s=5, done_file="_SUCCESS")
    got = wait_for_input(
        lambda: [{"url": "day"}], url=str(tmp_path / "day.tsv"), date="2026-01-01", input=cfg, clock=clock, sleep=sleep
    )
    assert got == [{"url": "day"}] and clock.now == 5
    assert done_marker_url("s3://b/in/day_*.tsv", "_SUCCESS") == "s3://b/in/_SUCCESS"
    with pytest.raises(ValueError, match="input.done_file"):
        InputConfig(done_file="a/b")
