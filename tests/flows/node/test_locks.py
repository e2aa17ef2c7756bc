"""The node's kernel locks (`flows.node.locks`), the model's train/publish slot first: one run at a time, never held
by a dead run, never shared by unrelated roots; the date's lock and the data lock of the same kind.

A free slot is exercised by every other flow test; these hold it from another process, as another
run of the model would.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import pytest

from flows.config import with_overrides
from flows.day.record import read_record
from flows.day.run import run_day
from flows.node.locks import Holder, ModelBusyError, data_lock, day_lock, node_slot
from flows.presets import demo
from pipeline.generate import generate_days
from storage.io.layout import Layout
from tests.helpers.procs import processes
from tests.helpers.slots import hold_slot

log = logging.getLogger("test-slot")


@pytest.mark.subprocess  # the holder is another process
def test_a_killed_holder_frees_the_slot_at_once(tmp_path):
    layout = Layout(str(tmp_path / "root"), "ctr")
    with processes() as procs:
        holder = hold_slot(procs, "node", layout.root, tmp_path / "holder.log")
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        with node_slot(layout, 30, log=log) as taken:
            assert taken.waited_s < 1.0  # the kernel dropped the lock with the process: nothing to wait for
            assert taken.holder.pid == os.getpid()


@pytest.mark.subprocess  # the holder is another process
def test_a_waiting_run_logs_whom_it_waits_for_and_its_timeout_names_the_holder(tmp_path, caplog):
    layout = Layout(str(tmp_path / "root"), "ctr")
    with processes() as procs:
        holder = hold_slot(procs, "node", layout.root, tmp_path / "holder.log")
        with (
            caplog.at_level(logging.INFO, logger="test-slot"),
            pytest.raises(ModelBusyError) as err,
            node_slot(layout, 3.5, log=log, report_every_s=1.0),
        ):
            pytest.fail("took a slot another process holds")
    who = f"pid {holder.pid} on host {socket.gethostname()}"
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert 3 <= len(waits) <= 5 and all(who in w and " since 20" in w for w in waits), waits  # once per period
    assert who in str(err.value) and "publish.lock_timeout_s" in str(err.value) and "slot.lock" in str(err.value)


def test_runs_on_unrelated_roots_never_wait_for_each_other(tmp_path):
    with node_slot(Layout(str(tmp_path / "a"), "ctr"), 30, log=log):
        t0 = time.monotonic()
        with node_slot(Layout(str(tmp_path / "b"), "ctr"), 1, log=log) as taken:
            assert taken.waited_s < 0.5
        assert time.monotonic() - t0 < 1.0


def test_the_holder_is_written_into_the_lock_file_while_it_holds_the_slot(tmp_path):
    layout = Layout(str(tmp_path / "root"), "ctr")
    path = tmp_path / "root" / "_local" / "ctr" / "slot.lock"
    with node_slot(layout, 30, log=log, flow_run="f00d") as taken:
        held = Holder.from_json(path.read_text())
        assert held == taken.holder and held.flow_run == "f00d" and held.pid == os.getpid()
        assert held.describe().startswith(f"run f00d on host {socket.gethostname()} (pid {os.getpid()}) since 20")
    assert Holder.from_json(path.read_text()) is None  # released: it names nobody


def test_one_run_of_a_models_date_at_a_time_while_other_dates_and_models_go_on(tmp_path):
    root = str(tmp_path / "root")
    ctr, other = Layout(root, "ctr"), Layout(root, "other")
    with day_lock(ctr, "2026-01-01", 30, log=log):
        for layout, date in ((ctr, "2026-01-02"), (other, "2026-01-01")):
            with day_lock(layout, date, 1, log=log) as taken:
                assert taken.waited_s < 0.5
        # a second run of the date (a lock of its own, as another process takes it) waits, then gives up naming it
        with (
            pytest.raises(ModelBusyError, match=r"the run of 2026-01-01 of model 'ctr' on this node .*date=2026-01-01"),
            day_lock(ctr, "2026-01-01", 1.5, log=log),
        ):
            pytest.fail("two runs of one date at once")


def test_the_data_stages_of_a_date_are_one_writer_at_a_time_whatever_the_model(tmp_path):
    root = str(tmp_path / "root")
    with data_lock(Layout(root, "ctr"), "2026-01-01", 30, log=log):
        with data_lock(Layout(root, "other"), "2026-01-02", 1, log=log) as taken:
            assert taken.waited_s < 0.5
        with (
            pytest.raises(ModelBusyError, match="the data stages of 2026-01-01"),
            data_lock(Layout(root, "other"), "2026-01-01", 1.5, log=log),
        ):
            pytest.fail("two writers of one date's events at once")


@pytest.mark.slow
@pytest.mark.subprocess  # the holder is another process
def test_a_second_run_waits_then_fails_clearly_and_changes_nothing(tmp_path):
    generate_days(str(tmp_path / "raw"), 1, 2000, seed=1, start_date="2026-05-01")
    cfg = with_overrides(
        demo(str(tmp_path / "root")),
        {
            "input.url": str(tmp_path / "raw" / "day_{date}.tsv.gz"),
            "dask.processes": False,
            "publish.lock_timeout_s": 3,
        },
    )
    # the day as the flow runs it without a Prefect server (`run_day`, the node's slot): the slot is all it waits for
    with processes() as procs, pytest.raises(ModelBusyError):  # another run holds the model
        holder = hold_slot(procs, "node", cfg.root, tmp_path / "holder.log")
        run_day(cfg, "2026-05-01")
    record = read_record(cfg.layout(), "2026-05-01")
    assert record.status == "failed" and "ModelBusyError" in record.reason
    assert f"pid {holder.pid} on host {socket.gethostname()}" in record.reason
    assert not (tmp_path / "root" / "models").exists()  # nothing trained or published
