"""The model's slot against a real Prefect server on 127.0.0.1: a SIGKILLed holder frees it within the stated bound.

The server is the session's (`prefect_api`, started with the same settings as any test's server,
`tests.helpers.procs.PREFECT_SERVER_ENV`, and the default repossessor loop an operator's server has): the limit is
keyed by the scenario's own root, so no other test's slot meets it.  The scenario waits a minute for the dead
holder's lease; it runs in the background from the start of the run (`tests.helpers.slot_scenario`), and the test
checks what it saw."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from flows.prefect.slot import DEAD_HOLDER_BOUND_S, LEASE_S, limit_name
from storage.io.layout import Layout
from tests.helpers import slot_scenario
from tests.helpers.procs import RUN_DIR_ENV


def test_the_limit_is_keyed_by_root_and_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert limit_name(Layout("./root", "ctr")) == limit_name(Layout(str(tmp_path / "root"), "ctr"))
    assert limit_name(Layout("./root", "ctr")).startswith("ctr-train-publish-ctr-")
    assert limit_name(Layout("./a", "ctr")) != limit_name(Layout("./b", "ctr")) != limit_name(Layout("./b", "m2"))


@pytest.fixture()
def killed_holder() -> dict:
    """The outcome of `tests.helpers.slot_scenario`, begun when the run started (`conftest.pytest_collection_finish`):
    a holder of a slot on the session's server, SIGKILLed, and the slot taken after it."""
    return slot_scenario.outcome(Path(os.environ[RUN_DIR_ENV]))


@pytest.mark.slow
@pytest.mark.server  # the session's Prefect server, a holder process killed
def test_a_killed_holders_slot_is_freed_by_the_server_within_the_bound(killed_holder):
    # the dead holder's lease had to expire: it held the slot, and no longer than the bound
    assert LEASE_S / 2 < killed_holder["freed_s"] < DEAD_HOLDER_BOUND_S, killed_holder
    assert killed_holder["waited_s"] > LEASE_S / 2, killed_holder
    assert killed_holder["node_lock"], killed_holder  # the node's lock is taken inside
    assert not killed_holder["holder_file_after"], killed_holder  # released: it names nobody
    holder, waits = killed_holder["holder"], killed_holder["waits"]
    assert waits and all(f"pid {holder['pid']} on host {holder['host']} since 20" in w for w in waits), waits
    assert holder["host"] == socket.gethostname()
