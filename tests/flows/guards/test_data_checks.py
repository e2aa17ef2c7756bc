"""The data checks: each bad day trips its named check against the window; a normal day passes them all;
with fewer than 2 prior days only the absolute checks run and the report says so."""

import copy

import pytest

from flows.guards.check_config import CHECKS, CheckAction, ChecksConfig
from flows.guards.data_checks import data_stats, psi, run_checks

DENSE = [0, 10, 30, 40, 15, 5] + [0] * 20


def day(
    rows=10_000, clicks=2_000, padded=0, quarantined=0, missing_c1=100, dup=0.0, hist=DENSE, oov=0.05, distinct=500
):
    stats = {"rows": rows, "clicks": clicks, "missing": {"I1": 0, "C1": missing_c1}, "dense_hist": {"I1": list(hist)}}
    fields = [{"field": "C1", "day_keys": distinct, "oov_rate_previous": oov}]
    return data_stats(
        rows_read=rows + quarantined,
        rows_quarantined=quarantined,
        rows_padded=padded,
        ingest_stats=stats,
        day_fields=fields,
        duplicate_share=dup,
    )


WINDOW = [("2026-01-01", day()), ("2026-01-02", day(rows=11_000, clicks=2_100)), ("2026-01-03", day())]
CFG = ChecksConfig()


def status(report, name):
    return next(r.status for r in report.results if r.name == name)


def test_a_normal_day_passes_every_check():
    report = run_checks(day(rows=10_500), WINDOW, CFG, leakage=(False, 0.62, 0.99, "largest: C1 (k_0)"))
    assert [r.name for r in report.results] == list(CHECKS)
    assert {r.status for r in report.results} == {"pass"} and report.note == "" and not report.failed
    assert report.window == ("2026-01-01", "2026-01-02", "2026-01-03")


@pytest.mark.parametrize(
    ("today", "check"),
    [
        (day(rows=2_000, clicks=400), "volume"),  # a partial export
        (day(rows=100_000, clicks=20_000), "volume"),  # a doubled-up one
        (day(clicks=0), "click_rate"),  # labels lost
        (day(clicks=6_000), "click_rate"),
        (day(padded=5_000), "padded_rows"),  # rows cut short
        (day(missing_c1=10_000), "missing_rate"),  # a field emptied upstream
        (day(dup=0.9), "duplicates"),  # a replay
    ],
)
def test_a_bad_day_fails_its_named_check(today, check):
    report = run_checks(today, WINDOW, CFG)
    assert status(report, check) == "fail"
    assert check in report.reason() and report.reason().startswith("data checks failed: ")


def test_shifts_of_values_and_keys_warn_by_default():
    shifted = day(hist=[0, 0, 0, 5, 15, 40, 30, 10] + [0] * 18, oov=0.6, distinct=5_000, quarantined=300)
    report = run_checks(shifted, WINDOW, CFG)
    for name in ("psi", "oov_rate", "distinct_keys", "quarantined"):
        assert status(report, name) == "warn", name
    assert not report.failed


def test_an_action_override_turns_a_failure_into_a_warning_or_skips_the_check():
    cfg = ChecksConfig(missing_rate=CheckAction(action="warn"), volume=CheckAction(action="off"))
    report = run_checks(day(missing_c1=10_000, rows=2_000, clicks=400), WINDOW, cfg)
    assert status(report, "missing_rate") == "warn" and "volume" not in [r.name for r in report.results]
    assert "off: volume" in report.note and not report.failed


def test_with_fewer_than_two_prior_days_only_the_absolute_checks_run():
    report = run_checks(day(rows=100), WINDOW[:1], CFG)
    assert [r.name for r in report.results] == ["padded_rows", "duplicates"]
    assert "only the absolute checks ran: 1 completed day(s)" in report.note
    first = run_checks(day(clicks=0), [], CFG)  # no labels on the very first day is still caught
    assert status(first, "click_rate") == "fail" and "AUC is undefined" in first.failed[0].detail


def test_psi_is_zero_for_equal_shapes_and_grows_with_the_shift():
    assert psi(DENSE, [2 * x for x in DENSE]) == pytest.approx(0.0)
    small = psi([0, 12, 28, 40, 15, 5] + [0] * 20, DENSE)
    large = psi([0, 0, 0, 5, 15, 80] + [0] * 20, DENSE)
    assert 0 < small < 0.25 < large
    assert psi([0] * 26, DENSE) == 0.0


def test_the_record_values_are_plain_data():
    report = run_checks(day(), WINDOW, CFG)
    row = report.results[0].to_dict()
    assert set(row) == {"name", "status", "value", "threshold", "detail"}
    assert copy.deepcopy(row) == row
