"""End to end: the daily flow through Prefect (the session's server), real Dask, real torchrun, real files.

These read as the product's specification: three synthetic days are ingested,
trained by 2 torchrun ranks and published in order by a backfill, which stops at
a day whose input is broken and, rerun once it is fixed, runs only that day and
the later ones; every row is accounted for; day 2 warm-starts from day 1; a rerun
changes nothing; a degraded model is refused and LATEST stays put.
"""

from __future__ import annotations

import gzip
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from flows.config import with_overrides
from flows.day.record import DayRecord, read_record
from flows.day.run import OVERHEADS, STAGES
from flows.prefect.daily import _ingest_ahead, backfill, daily_retrain
from flows.presets import demo
from pipeline.generate import generate_days
from storage.io.layout import Layout
from storage.io.registry import ModelRegistry
from tests.helpers.pristine import Pristine
from trainer.model_dir import read_meta

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_in_process")]  # days run: Dask, Prefect, torchrun

DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
ROWS = 3000


def _config(root: Path, **overrides):
    cfg = demo(str(root))
    base = {
        "input.url": str(root / "raw" / "day_{date}.tsv.gz"),
        "dask.processes": False,
        "dask.n_workers": 2,
        "optim.batch_size": 128,
    }
    return with_overrides(cfg, {**base, **overrides})


def _lines(path: Path) -> int:
    with gzip.open(path, "rt") as f:
        return sum(1 for _ in f)


@dataclass(frozen=True)
class StoppedBackfill:
    """What the first backfill left: it stopped at day 2, whose input was broken."""

    state: Any
    records: dict[str, DayRecord | None]
    latest: str | None
    day1_mtime: float
    """When day 1's record was written (the rerun must not write it again)."""


@pytest.fixture(scope="module")
def built_three_days(tmp_path_factory, prefect_in_process):
    """Three generated days run once per module by a backfill on 2 ranks, day 3 with two malformed lines appended:
    day 2's input is broken at first (the backfill stops there), then fixed and the same backfill run again."""
    root = tmp_path_factory.mktemp("e2e") / "root"
    generate_days(str(root / "raw"), 3, ROWS, seed=7, start_date=DAYS[0])
    day3 = root / "raw" / f"day_{DAYS[2]}.tsv.gz"
    with gzip.open(day3, "ab") as f:
        f.write(b"1\tnot-a-number\n")
        f.write(b"7" + b"\t1" * 13 + b"\tabc" * 26 + b"\n")  # label 7
    day2 = root / "raw" / f"day_{DAYS[1]}.tsv.gz"
    good = day2.read_bytes()
    day2.write_bytes(gzip.compress(b"garbage line without tabs\n" * 200 + gzip.decompress(good)))  # 6% bad lines
    cfg = _config(root, **{"trainer.nproc_per_node": 2})
    first = backfill(DAYS[0], DAYS[2], config=cfg.to_dict(), return_state=True)
    stopped = StoppedBackfill(
        first,
        {d: read_record(cfg.layout(), d) for d in DAYS},
        ModelRegistry(cfg.layout()).latest(),
        (root / "runs" / "ctr" / f"date={DAYS[0]}" / "metrics.json").stat().st_mtime,
    )
    day2.write_bytes(good)  # fixed input, the same backfill
    rerun = backfill(DAYS[0], DAYS[2], config=cfg.to_dict(), return_state=True)
    day1_mtime = (root / "runs" / "ctr" / f"date={DAYS[0]}" / "metrics.json").stat().st_mtime
    return Pristine(root), (root, cfg, stopped, (rerun, day1_mtime))


@pytest.fixture()
def three_days(built_three_days):
    """The three days' root as the flow left it (the refused-model test adds a fourth day to it)."""
    pristine, days = built_three_days
    pristine.restore()
    return days


def test_a_backfill_stops_at_a_broken_day_and_its_rerun_runs_only_that_day_and_the_later_ones(three_days):
    _, _, stopped, (rerun, day1_mtime) = three_days
    assert stopped.state.is_failed(), stopped.state
    assert f"stopped at {DAYS[1]} in ingest" in stopped.state.message, stopped.state.message
    first, broken, later = (stopped.records[d] for d in DAYS)
    assert first.status == "published" and first.model_version == "v00001"
    assert broken.status == "failed" and broken.failed_stage == "ingest" and not broken.completed
    assert later is None  # never started
    assert stopped.latest == "v00001"
    assert rerun.is_completed(), rerun
    assert rerun.result() == {"completed": DAYS[1:], "skipped": DAYS[:1], "refused": [], "not_run": []}
    assert day1_mtime == stopped.day1_mtime


def test_every_day_completes_and_is_published(three_days):
    root, cfg, _, _ = three_days
    records = [read_record(cfg.layout(), d) for d in DAYS]
    assert [r.status for r in records] == ["published"] * 3
    assert [r.model_version for r in records] == ["v00001", "v00002", "v00003"]
    assert ModelRegistry(Layout(str(root), cfg.model_name)).latest() == "v00003"
    for r in records:
        assert r.completed and r.published and r.latest_version == r.model_version
        assert 0.5 < r.auc <= 1.0 and 0.0 < r.logloss < 1.0
        assert r.rows_ingested > 0 and r.rows_eval >= cfg.publish.min_eval_rows
        assert set(r.seconds) == {s.name for s in STAGES} | set(OVERHEADS)  # Prefect's start counted too
        assert abs(sum(r.seconds.values()) - r.wall_s) < 0.2 + 0.01 * r.wall_s


def test_rows_are_accounted_for(three_days):
    root, cfg, _, _ = three_days
    for date in DAYS:
        r = read_record(cfg.layout(), date)
        lines = _lines(root / "raw" / f"day_{date}.tsv.gz")
        assert r.rows_read == lines
        assert r.rows_read == r.rows_ingested + r.rows_quarantined
        events = pq.read_table(root / "events" / f"date={date}").num_rows
        assert events == r.rows_ingested
        assert r.rows_train + r.rows_eval == r.rows_ingested
    r3 = read_record(cfg.layout(), DAYS[2])
    assert r3.rows_quarantined == 2
    quarantine = pq.read_table(root / "quarantine" / f"date={DAYS[2]}").to_pandas()
    assert sorted(quarantine["line"].tolist()) == [ROWS + 1, ROWS + 2]
    assert quarantine["reason"].str.len().min() > 0


def test_the_model_learns_the_planted_signal(three_days):
    _, cfg, _, _ = three_days
    aucs = [read_record(cfg.layout(), d).auc for d in DAYS]
    assert min(aucs) > 0.62, aucs


def test_day_two_warm_starts_from_day_one(three_days):
    root, cfg, _, _ = three_days
    reg = ModelRegistry(Layout(str(root), cfg.model_name))
    assert reg.read_json("v00001", "lineage.json")["parent_version"] is None
    assert reg.read_json("v00002", "lineage.json")["parent_version"] == "v00001"
    assert reg.read_json("v00003", "lineage.json")["parent_version"] == "v00002"
    assert read_record(cfg.layout(), DAYS[1]).train["warm_start"] == "from v00001"
    assert read_record(cfg.layout(), DAYS[0]).train["warm_start"] == "cold: no published model"
    init = json.loads((root / "runs" / "ctr" / f"date={DAYS[1]}" / "model" / "model.json").read_text())[
        "init_model_url"
    ]
    assert init.rstrip("/").endswith("models/ctr/v00001")
    # the day-2 table still holds rows trained on day 1 only: the sparse state was carried over
    assert len(list((root / "models/ctr/v00002/sparse").glob("part-*.parquet"))) == 2  # one part per rank
    keys1 = set(pq.read_table(root / "models/ctr/v00001/sparse").column("key").to_pylist())
    keys2 = set(pq.read_table(root / "models/ctr/v00002/sparse").column("key").to_pylist())
    assert keys1 <= keys2
    clocks = pq.read_table(root / "models/ctr/v00002/sparse").to_pandas().set_index("key")["clock"]
    day1 = pq.read_table(root / "models/ctr/v00001/sparse").to_pandas().set_index("key")["clock"]
    common = day1.index.intersection(clocks.index)
    assert (clocks.loc[common] >= day1.loc[common]).all() and (clocks.loc[common] > day1.loc[common]).any()


def test_each_day_trains_the_eval_rows_of_the_day_before_it_first(three_days):
    root, cfg, _, _ = three_days
    first = read_record(cfg.layout(), DAYS[0])
    assert first.train["parent_eval"] == {"date": None, "rows": 0, "reason": "no published model"}
    for before, day in zip(DAYS, DAYS[1:], strict=False):
        prior, record = read_record(cfg.layout(), before), read_record(cfg.layout(), day)
        assert record.train["parent_eval"]["date"] == before and record.train["parent_eval"]["rows"] == prior.rows_eval
        meta = read_meta(cfg.layout().run_model(day))
        assert meta.train["carried"] == {"date": before, "rows": prior.rows_eval}
        rows, world = record.rows_train + prior.rows_eval, meta.train["world_size"]
        assert world == 2 and meta.recipe["world_size"] == 2
        assert meta.recipe["rows"] == rows  # the recipe was sized to every row trained
        assert meta.train["examples"] == meta.optim["epochs"] * (rows // world * world)


def test_the_companions_c_is_chosen_again_when_the_rows_double_and_kept_in_between(three_days):
    _, cfg, _, _ = three_days
    records = [read_meta(cfg.layout().run_model(d)).companion for d in DAYS]
    assert all(r is not None for r in records)  # days of 3,000 generated rows: a companion each (auto)
    rows = [r["rows"] for r in records]
    chosen = [r["C_chosen"] for r in records]
    # day 2's rows are twice day 1's: chosen again; day 3's are fewer than twice day 2's: day 2's C, refit
    assert rows[1] >= 2 * rows[0] and rows[2] < 2 * rows[1], rows
    assert chosen[:2] == [{"rows": rows[0], "fits_ago": 0}, {"rows": rows[1], "fits_ago": 0}]
    assert chosen[2] == {"rows": rows[1], "fits_ago": 1} and records[2]["C"] == records[1]["C"]
    assert records[2]["holdout_logloss"] == {} and len(records[1]["holdout_logloss"]) >= 2


def test_rerun_of_a_completed_date_changes_nothing(three_days):
    root, cfg, _, _ = three_days
    before = read_record(cfg.layout(), DAYS[1])
    manifest = (root / "events" / f"date={DAYS[1]}" / "_SUCCESS.json").read_text()
    registry = ModelRegistry(Layout(str(root), cfg.model_name))
    versions, latest = registry.versions(), registry.latest()
    state = daily_retrain(DAYS[1], config=cfg.to_dict(), return_state=True)
    assert state.is_completed()
    assert read_record(cfg.layout(), DAYS[1]) == before
    assert (root / "events" / f"date={DAYS[1]}" / "_SUCCESS.json").read_text() == manifest
    assert (registry.versions(), registry.latest()) == (versions, latest)  # no new version, LATEST unmoved


def test_a_degraded_model_is_refused_and_latest_stays(three_days):
    root, cfg, _, _ = three_days
    generate_days(str(root / "raw"), 1, ROWS, seed=7, start_date="2026-01-04")
    # the network alone, on one rank: what the gate must refuse is its divergence, and a companion on the lineage's
    # ~11,000 rows would cost this test most of its time (the companion's own runs: tests/trainer/companion/test_fit.py;
    # 2 ranks: the three days above)
    bad = with_overrides(
        cfg,
        {
            "optim.lr": 3.0,
            "optim.sparse_lr": 30.0,
            "publish.max_auc_drop": 0.0,
            "model.companion": "off",
            "trainer.nproc_per_node": 1,
        },
    )
    state = daily_retrain("2026-01-04", config=bad.to_dict(), return_state=True)
    assert state.is_failed() and state.name == "PublishRefused"
    record = read_record(cfg.layout(), "2026-01-04")
    assert record.status == "refused" and not record.published
    assert "below the published model" in record.reason
    reg = ModelRegistry(Layout(str(root), cfg.model_name))
    assert reg.latest() == "v00003"
    assert reg.info(record.model_version).status == "refused"


def test_backfill_skips_completed_dates_and_reports(three_days, caplog):
    _, cfg, _, _ = three_days
    with caplog.at_level(logging.INFO, logger="prefect.flow_runs"):  # the suite keeps Prefect at WARNING
        report = backfill(DAYS[0], DAYS[2], config=cfg.to_dict())
    assert report["skipped"] == DAYS and report["completed"] == []
    skipped = [r.getMessage() for r in caplog.records if getattr(r, "ctrpipe_console", False)]
    assert skipped == [f"backfill: {d} already completed (published v0000{i + 1}); skipped" for i, d in enumerate(DAYS)]


def test_ingest_ahead_of_a_date_without_input_reports_nothing_and_commits_the_others(tmp_path, caplog):
    root = tmp_path / "root"
    generate_days(str(root / "raw"), 1, 500, seed=1, start_date="2026-01-02")
    with caplog.at_level(logging.INFO):
        futures, close = _ingest_ahead(_config(root), ["2026-01-02", "2026-01-03"], 2)
        try:
            assert [f.result() for f in futures.values()] == [None, None]
        finally:
            close()
    assert (root / "events" / "date=2026-01-02" / "_SUCCESS.json").exists()
    assert not (root / "events" / "date=2026-01-03").exists()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []  # its turn reports it
