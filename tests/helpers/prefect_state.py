"""What a real Prefect server (`tests.helpers.procs.PrefectServer`) holds, read from the test process: its
deployments, automations and work pools.  A Prefect client in this process talks to the server whose API URL it is
given, whatever this process's own settings say (the suite's in-process flows run against Prefect's temporary
server); no child process has to start (and import Prefect) for each read."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def client_of(api: str) -> Iterator[Any]:
    """A synchronous Prefect client of the server at `api` (its PREFECT_API_URL), and this process's Prefect settings
    pointing there while it is open (so that `Automation(...).create()` and the like go there too)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        yield client


def deployments(api: str) -> dict[str, Any]:
    """Deployment name -> its deployment, as the server at `api` has them."""
    with client_of(api) as client:
        return {d.name: d for d in client.read_deployments()}


def automation_names(api: str) -> list[str]:
    """The names of the server's automations, sorted."""
    with client_of(api) as client:
        return sorted(a.name for a in client.read_automations())


def work_pool_names(api: str) -> list[str]:
    """The names of the server's work pools, sorted."""
    with client_of(api) as client:
        return sorted(p.name for p in client.read_work_pools())
