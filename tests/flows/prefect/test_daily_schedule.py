"""`flows.prefect.daily.resolve_date`: the scheduled run processes the day before its *scheduled* time, however late it
starts.
"""

import datetime as dt

import pytest

from flows.prefect.daily import resolve_date

UTC = dt.UTC


def test_a_scheduled_run_processes_the_previous_day():
    assert resolve_date(None, dt.datetime(2026, 3, 2, 2, 0, tzinfo=UTC)) == "2026-03-01"


def test_a_late_run_still_processes_the_day_it_was_scheduled_for():
    # scheduled for 2026-03-02 02:00 but picked up a day and a half later: still 2026-03-01
    scheduled = dt.datetime(2026, 3, 2, 2, 0, tzinfo=UTC)
    assert resolve_date("", scheduled) == "2026-03-01"


def test_an_explicit_date_wins_and_is_validated():
    assert resolve_date("2026-01-05", dt.datetime(2026, 3, 2, tzinfo=UTC)) == "2026-01-05"
    with pytest.raises(ValueError):
        resolve_date("../2026-01-05", None)
