"""The model's slot against a real Prefect server on 127.0.0.1: a SIGKILLed holder frees it within the stated bound.

The server is the session's (`prefect_api`, started with the same settings as any test's server,
`tests.helpers.procs.PREFECT_SERVER_ENV`, and the default repossessor loop an operator's server has): the limit is
keyed by the test's own root, so no other test's slot meets it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.prefect.slot import DEAD_HOLDER_BOUND_S, LEASE_S, limit_name, server_slot
from storage.io.layout import Layout
from tests.helpers.procs import processes
from tests.helpers.slots import hold_slot

log = logging.getLogger("test-prefect-slot")


def test_the_limit_is_keyed_by_root_and_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert limit_name(Layout("./root", "ctr")) == limit_name(Layout(str(tmp_path / "root"), "ctr"))
    assert limit_name(Layout("./root", "ctr")).startswith("ctr-train-publish-ctr-")
    assert limit_name(Layout("./a", "ctr")) != limit_name(Layout("./b", "ctr")) != limit_name(Layout("./b", "m2"))


@pytest.mark.slow
@pytest.mark.server  # the session's Prefect server, a holder process killed
def test_a_killed_holders_slot_is_freed_by_the_server_within_the_bound(tmp_path, caplog, prefect_api):
    root = tmp_path / "root"
    layout = Layout(str(root), "ctr")
    with processes() as procs:
        holder = hold_slot(procs, "server", root, tmp_path / "holder.log", env={"PREFECT_API_URL": prefect_api})
        killed = time.monotonic()
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        with temporary_settings({PREFECT_API_URL: prefect_api}), caplog.at_level(logging.INFO, logger=log.name):
            with server_slot(layout, 300, log=log, report_every_s=20) as taken:
                freed = time.monotonic() - killed
                # the dead holder's lease had to expire: it held the slot, and no longer than the bound
                assert LEASE_S / 2 < freed < DEAD_HOLDER_BOUND_S, freed
                assert taken.waited_s > LEASE_S / 2
                assert (root / "_local" / "ctr" / "slot.lock").read_text()  # the node's lock is taken inside
            assert not (root / "models" / "ctr" / "slot-holder.json").exists()  # released: it names nobody
    waits = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert waits and all(f"pid {holder.pid} on host {socket.gethostname()} since 20" in w for w in waits), waits
