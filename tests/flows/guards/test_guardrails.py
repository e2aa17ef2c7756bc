"""Bad days of real data are stopped by a named check and leave LATEST alone; real days pass every check.

Three days cut from the real Criteo sample; after two good days the third arrives broken in the ways an
unattended line meets (rows cut short, a field emptied upstream, the file replayed 10 times, every
label 0): each stops before training with a named data check.  A real change is let through with an
action override, which the lineage records; the real third day then passes every check, and an older
date forced afterwards is trained but not made LATEST.  A first Avazu day too small to learn from is
refused by the AUC floor.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.main import main
from flows.config import RunConfig, with_overrides
from flows.day.record import read_record
from flows.day.run import run_day
from flows.prefect.daily import daily_retrain
from flows.presets import demo
from storage.io.registry import ModelRegistry
from tests.helpers.pristine import Pristine

# days run: a Dask scheduler, Prefect (the session's server), torchrun
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_in_process")]

DAYS = ["2026-04-01", "2026-04-02", "2026-04-03"]


def _cfg(root: Path, raw: Path, **overrides) -> RunConfig:
    return with_overrides(
        demo(str(root)),
        {
            "input.url": str(raw / "day_{date}.tsv"),
            "dask.processes": False,
            "dask.n_workers": 1,
            "vocab.min_count": 2,
            "model.mlp_dims": [32, 16],
            "optim.k_steps": 5,
            "publish.max_auc_drop": 0.05,
            "publish.max_logloss_increase": 0.05,  # ~330 eval rows decide changes of 0.05, not of 0.01
            "publish.min_eval_rows": 50,
            "publish.calibration_range": [0.5, 2.0],  # ~330 eval rows after a dozen steps
            # the network alone: a companion's fit would be most of each day's training, and these tests are about
            # the checks and the gate (the companion's runs: tests/flows/serving/test_companion.py)
            "model.companion": "off",
            **overrides,
        },
    )


def _write(raw: Path, date: str, lines: list[bytes]) -> None:
    (raw / f"day_{date}.tsv").write_bytes(b"".join(lines))


def _cut(line: bytes, fields: int) -> bytes:
    return b"\t".join(line.rstrip(b"\n").split(b"\t")[:fields]) + b"\n"


def _emptied(line: bytes, column: int) -> bytes:
    parts = line.rstrip(b"\n").split(b"\t")
    parts[column] = b""
    return b"\t".join(parts) + b"\n"


@pytest.fixture(scope="module")
def built_two_good_days(shared_data, tmp_path_factory, prefect_in_process):
    """The two good days run once per module, and a copy to give each test."""
    base = tmp_path_factory.mktemp("guard")
    raw = base / "raw"
    raw.mkdir()
    lines = (shared_data / "criteo" / "train_head_10k.tsv").read_bytes().splitlines(keepends=True)
    n = len(lines) // 3
    thirds = [lines[i * n : (i + 1) * n] for i in range(3)]
    for date, part in zip(DAYS[:2], thirds, strict=False):
        _write(raw, date, part)
    cfg = _cfg(base / "root", raw)
    records = [run_day(cfg, d).record for d in DAYS[:2]]
    return Pristine(base), (base, raw, cfg, thirds[2], records)


@pytest.fixture()
def two_good_days(built_two_good_days):
    """The root and raw folder of the two good days as they were built: each test writes its own third day
    and runs it (publishing it, or forcing an older date), which the next test must not find."""
    pristine, days = built_two_good_days
    pristine.restore()
    return days


def test_the_first_real_days_pass_the_absolute_checks_and_say_why_the_others_did_not_run(two_good_days):
    _, _, _, _, records = two_good_days
    assert [r.status for r in records] == ["published", "published"], [r.reason for r in records]
    for r in records:
        assert {c["name"] for c in r.checks} == {"padded_rows", "duplicates", "leakage"}
        assert all(c["status"] == "pass" for c in r.checks)
        assert "only the absolute checks ran" in r.checks_note and r.data_stats["rows_read"] == 3333
    assert records[1].gate and all(c["passed"] for c in records[1].gate)


@pytest.mark.parametrize(
    ("name", "broken", "check"),
    [
        ("rows cut to 20 of 40 fields", lambda lines: [_cut(x, 20) for x in lines], "padded_rows"),
        ("one field empty in every row", lambda lines: [_emptied(x, 16) for x in lines], "missing_rate"),  # C3
        ("the file replayed 10 times", lambda lines: lines * 10, "volume"),
        ("every label 0", lambda lines: [b"0" + x[1:] for x in lines], "click_rate"),
    ],
)
def test_a_broken_day_is_stopped_by_a_named_check_and_latest_stays(two_good_days, name, broken, check):
    _, raw, cfg, third, _ = two_good_days
    _write(raw, DAYS[2], broken(third))
    record = run_day(cfg, DAYS[2]).record
    assert record.status == "check_failed" and not record.completed, (name, record.reason)
    failed = {c["name"] for c in record.checks if c["status"] == "fail"}
    assert check in failed and f"{check}:" in record.reason, (name, record.checks)
    assert record.checks_window == DAYS[:2] and record.model_version is None
    assert ModelRegistry(cfg.layout()).latest() == "v00002"
    assert not Path(cfg.layout().run_model(DAYS[2])).exists()  # nothing trained
    assert Path(cfg.layout().run_checks_chart(DAYS[2])).read_bytes()[:4] == b"\x89PNG"
    if check == "volume":
        assert "duplicates" in failed  # the replay is also a duplicate share of 0.9


def test_the_flow_of_a_stopped_day_ends_in_data_check_failed(two_good_days):
    _, raw, cfg, third, _ = two_good_days
    _write(raw, DAYS[2], [b"0" + x[1:] for x in third])
    state = daily_retrain(DAYS[2], config=cfg.to_dict(), return_state=True)
    assert state.is_failed() and state.name == "DataCheckFailed"
    assert f"model {cfg.model_name}, {DAYS[2]}" in state.message and "click_rate" in state.message


def test_a_real_change_goes_through_with_an_override_the_lineage_records(two_good_days):
    _, raw, cfg, third, _ = two_good_days
    _write(raw, DAYS[2], [_emptied(x, 16) for x in third])  # say C3 was retired upstream on purpose
    record = run_day(with_overrides(cfg, {"checks.missing_rate.action": "warn"}), DAYS[2]).record
    assert record.completed and record.model_version, record.reason
    assert next(c for c in record.checks if c["name"] == "missing_rate")["status"] == "warn"
    lineage = ModelRegistry(cfg.layout()).read_json(record.model_version, "lineage.json")
    assert lineage["check_overrides"] == {"missing_rate": "warn"}


def test_the_real_third_day_passes_every_check_and_an_older_forced_date_is_not_made_latest(two_good_days, tmp_path):
    base, raw, cfg, third, _ = two_good_days
    _write(raw, DAYS[2], third)
    record = run_day(cfg, DAYS[2], force=True).record
    assert record.completed and record.checks_note == "", record.reason
    assert {c["name"] for c in record.checks} == {
        "volume",
        "click_rate",
        "padded_rows",
        "missing_rate",
        "duplicates",
        "leakage",
        "quarantined",
        "psi",
        "oov_rate",
        "distinct_keys",
    }
    assert all(c["status"] == "pass" for c in record.checks), record.checks
    registry = ModelRegistry(cfg.layout())
    latest = registry.latest()
    assert registry.info(latest).metrics["date"] == DAYS[2]

    config = tmp_path / "config.yaml"
    config.write_text(f"root: {cfg.root}\n")
    # --recipe: the earlier spelling of --preset, still accepted
    args = ["run", "--date", DAYS[0], "--force", "--recipe", "demo", "--config", str(config)]
    args += [
        f"--set={k}={v}"
        for k, v in {
            "input.url": cfg.input.url,
            "dask.processes": "false",
            "dask.n_workers": 1,
            "vocab.min_count": 2,
            "model.mlp_dims": "[32, 16]",
            "optim.k_steps": 5,
            "publish.max_auc_drop": 0.05,
            "publish.min_eval_rows": 50,
            "publish.calibration_range": "[0.5, 2.0]",
            "model.companion": "off",
        }.items()
    ]
    assert main(args) == 2
    older = read_record(cfg.layout(), DAYS[0])
    assert older.status == "refused" and older.reason.startswith(f"older than LATEST (trained through {DAYS[2]})")
    assert registry.latest() == latest and registry.info(older.model_version).status == "refused"


def test_a_first_avazu_day_too_small_to_learn_from_is_refused_by_the_auc_floor(shared_data, tmp_path):
    cfg = with_overrides(
        demo(str(tmp_path / "root")),
        {
            "input.url": str(shared_data / "avazu" / "avazu_14102100.csv"),
            "input.format": "avazu",
            "dask.processes": False,
            "dask.n_workers": 1,
            "optim.batch_size": 4096,
            "publish.min_eval_rows": 50,
            "optim.lr": 1e-6,
            "optim.sparse_lr": 1e-6,
            "optim.epochs": 1,  # 3 steps that move nothing: the initial model
            "model.companion": "off",  # a companion would learn the day (AUC 0.72 here): the floor is for a network's
        },
    )
    record = run_day(cfg, "2014-10-21").record
    assert record.train["steps"] <= 3
    assert record.status == "refused" and "publish.min_auc=0.55" in record.reason, (record.auc, record.reason)
    assert ModelRegistry(cfg.layout()).latest() is None
