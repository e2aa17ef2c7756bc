"""`flows.prefect.daily`'s dates: the scheduled run processes the day before its *scheduled* time, however late it
starts (`resolve_date`); a backfill's report names a run of three or more dates as a range (`_dates`).
"""

import datetime as dt

import pytest

from flows.prefect.daily import _dates, resolve_date

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


def test_a_backfills_report_names_a_run_of_dates_as_a_range_and_others_as_a_list():
    assert _dates(["2026-01-01", "2026-01-02", "2026-01-03"]) == "2026-01-01..2026-01-03"
    assert _dates(["2026-01-01", "2026-01-02"]) == "2026-01-01, 2026-01-02"
    assert _dates(["2026-01-01", "2026-01-03", "2026-01-04"]) == "2026-01-01, 2026-01-03, 2026-01-04"  # a gap
    assert _dates([]) == "none"
