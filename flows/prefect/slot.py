"""The train -> publish slot across machines: a Prefect global concurrency limit with a short lease.

Against a Prefect server (PREFECT_API_URL set) runs of one model may start on different machines
that share the root, so the node's kernel lock (`flows.node.locks`) is not enough.  The slot is then the
limit `ctr-train-publish-<model>-<root digest>` (one slot), keyed by the root and the model so that
unrelated roots never wait for each other.  It is taken with a lease of `LEASE_S` (the server's
minimum) that a thread renews every 3/4 of it while the holder lives; when the holder dies, the
server's repossessor (every `PREFECT_SERVER_SERVICES_REPOSSESSOR_LOOP_SECONDS`, 15 s by default)
revokes the expired lease, so a dead holder keeps the slot at most `DEAD_HOLDER_BOUND_S`.  A lease
that cannot be renewed stops the run: the slot may have gone to another run.

The server must keep leases across its own restarts
(`PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=prefect.server.concurrency.lease_storage.filesystem`):
the default in-memory store forgets them while the slot count stays in the database, and nothing
would free the slot again.

The holder writes who it is to `<root>/models/<model>/slot-holder.json` (`Layout.slot_holder`), which
waiting runs on any machine read for their "waiting for run R on host H since T" line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import ConcurrencyLeaseHolder
from prefect.concurrency.sync import concurrency
from prefect.settings import PREFECT_API_URL

from flows.node.locks import REPORT_EVERY_S, Holder, Taken, node_slot, wait_for_slot
from storage.io import fsio
from storage.io.layout import Layout, root_digest

LEASE_S = 60.0
"""Lease of the slot; the server accepts no shorter one."""
DEAD_HOLDER_BOUND_S = 90.0
"""How long a killed holder keeps the slot at most: the lease, one repossessor pass, and some slack."""


def server_configured() -> bool:
    """Whether runs talk to a Prefect server (PREFECT_API_URL, from the environment or a profile)."""
    return bool(PREFECT_API_URL.value())


def limit_name(layout: Layout) -> str:
    return f"ctr-train-publish-{layout.model_name}-{root_digest(layout.root)}"


def ensure_limit(layout: Layout) -> str:
    """Create the limit of `layout`'s model and root (1 slot) if it does not exist yet; returns its name."""
    name = limit_name(layout)
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(name, 1)
    return name


def read_holder(layout: Layout) -> Holder | None:
    fs, path = layout.fs(layout.slot_holder())
    try:
        with fs.open(path, "r") as f:
            return Holder.from_json(f.read())
    except FileNotFoundError:
        return None


@contextmanager
def server_slot(
    layout: Layout,
    timeout_s: float,
    *,
    log: logging.Logger | logging.LoggerAdapter,
    flow_run: str | None = None,
    report_every_s: float = REPORT_EVERY_S,
) -> Iterator[Taken]:
    """Hold the slot of `layout`'s model and root on the Prefect server, then this node's slot, for the block."""
    name = ensure_limit(layout)
    holder = ConcurrencyLeaseHolder(type="flow_run", id=UUID(flow_run)) if flow_run else None
    with ExitStack() as stack:

        def take(budget_s: float) -> bool:
            try:
                stack.enter_context(
                    concurrency(
                        name,
                        occupy=1,
                        timeout_seconds=budget_s,
                        strict=True,
                        lease_duration=LEASE_S,
                        holder=holder,
                        raise_on_lease_renewal_failure=True,
                    )
                )
            except TimeoutError:
                return False
            return True

        quiet = _BusyIsNotAnError()
        _PREFECT_CONCURRENCY_LOG.addFilter(quiet)
        try:
            waited = wait_for_slot(
                take,
                lambda: read_holder(layout),
                what=f"the Prefect slot {name!r} of model {layout.model_name!r} on {layout.root}",
                timeout_s=timeout_s,
                log=log,
                report_every_s=report_every_s,
            )
        finally:
            _PREFECT_CONCURRENCY_LOG.removeFilter(quiet)
        fs, path = layout.fs(layout.slot_holder())
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        me = Holder.me(flow_run)
        fsio.write_text_atomic(fs, path, me.to_json())
        stack.callback(_forget, layout, me)
        with node_slot(
            layout, max(1.0, timeout_s - waited), log=log, flow_run=flow_run, report_every_s=report_every_s
        ) as node:
            yield Taken(me, waited + node.waited_s)


_PREFECT_CONCURRENCY_LOG = logging.getLogger("prefect._internal.concurrency")


class _BusyIsNotAnError(logging.Filter):
    """Prefect logs an ERROR for every acquisition attempt that timed out; here that is the slot being busy,
    which `wait_for_slot` reports once a minute with the holder's name."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("ConcurrencySlotAcquisition" in message and "TimeoutError" in message)


def _forget(layout: Layout, me: Holder) -> None:
    """Remove the holder file if it still names this run (the next holder writes its own)."""
    if read_holder(layout) == me:
        fs, path = layout.fs(layout.slot_holder())
        fs.rm(path)
