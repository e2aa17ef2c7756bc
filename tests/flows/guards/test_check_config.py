"""The checks section: thresholds and actions validated with the key named; overrides are listed for the lineage."""

import pytest

from flows.guards.check_config import CHECKS, CheckAction, ChecksConfig, overridden


def test_every_check_has_an_action_and_the_defaults_fail_on_broken_data_and_warn_on_shifts():
    cfg = ChecksConfig()
    assert {n: cfg.action(n) for n in CHECKS} == {
        "volume": "fail",
        "click_rate": "fail",
        "padded_rows": "fail",
        "missing_rate": "fail",
        "duplicates": "fail",
        "leakage": "fail",
        "quarantined": "warn",
        "psi": "warn",
        "oov_rate": "warn",
        "distinct_keys": "warn",
    }
    assert overridden(cfg) == {}
    assert overridden(ChecksConfig(volume=CheckAction(action="off"), psi=CheckAction(action="fail"))) == {
        "volume": "off",
        "psi": "fail",
    }


def test_bad_thresholds_and_actions_name_the_key():
    with pytest.raises(ValueError, match="checks.max_psi"):
        ChecksConfig(max_psi=-1)
    with pytest.raises(ValueError, match="checks.min_volume_ratio"):
        ChecksConfig(min_volume_ratio=2.0)
    with pytest.raises(ValueError, match="action must be one of"):
        CheckAction(action="ignore")
