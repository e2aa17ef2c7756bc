"""The node's kernel file locks: one shared implementation (`file_lock`) and the three locks a run takes with it.

- `node_slot`: the model's train/publish slot, one run of a model at a time.  Two runs of one model on one
  node (a scheduled run and an on-demand one, a backfill and a rerun) would share the node's SSD shards and
  race on `LATEST`.  The lock file is `<local_dir>/<model>/slot.lock` (`NodeLayout.slot_lock`): it sits
  beside the shards it guards, and the default node-local folder is per root, so runs on unrelated roots
  never wait for each other.  Against a Prefect server the flow takes the cross-machine slot of
  `flows.prefect.slot` first, then this one.
- `day_lock`: one run of a model's date at a time (a second run waits, then finds the date completed).
- `data_lock`: one writer of a date's data stages at a time, whatever the model (events are shared by every
  model of the root).

Each is an exclusive `flock`, which the kernel drops when the holding process exits, however it exits
(SIGKILL, an OOM kill), so a dead run never holds a lock and its rerun takes it at once; no database counter
can leak.  The holder writes who it is into the lock file (host, pid, flow run, since when).  A waiting run
reads it and logs "waiting for run R on host H since T" once a minute, and fails after
`publish.lock_timeout_s` with an error naming the holder.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from storage.io.layout import Layout

REPORT_EVERY_S = 60.0
"""How often a waiting run logs whom it waits for."""
_FIRST_TRY_S = 1.0
_POLL_S = 0.2


class ModelBusyError(RuntimeError):
    """Another run held one of these locks (or the server's slot) for longer than `publish.lock_timeout_s`."""


@dataclass(frozen=True)
class Holder:
    """Who holds a slot, as waiting runs see it."""

    host: str
    pid: int
    since: str
    """When it took the slot (UTC, ISO 8601)."""
    flow_run: str | None = None
    """Its Prefect flow run id (None outside a flow)."""

    @classmethod
    def me(cls, flow_run: str | None = None) -> Holder:
        now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        return cls(host=socket.gethostname(), pid=os.getpid(), since=now, flow_run=flow_run)

    def describe(self) -> str:
        if self.flow_run:
            return f"run {self.flow_run} on host {self.host} (pid {self.pid}) since {self.since}"
        return f"run pid {self.pid} on host {self.host} since {self.since}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Holder | None:
        """The holder a slot file names; None when it names none (free, or being written)."""
        try:
            return cls(**json.loads(text))
        except (ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Taken:
    """What a run learns when it takes the slot."""

    holder: Holder
    """This run."""
    waited_s: float
    """How long it waited for the slot."""


def describe(holder: Holder | None) -> str:
    return holder.describe() if holder else "a run that has not said who it is"


def wait_for_slot(
    take: Callable[[float], bool],
    holder: Callable[[], Holder | None],
    *,
    what: str,
    timeout_s: float,
    log: logging.Logger | logging.LoggerAdapter,
    report_every_s: float = REPORT_EVERY_S,
) -> float:
    """Call `take(budget_s)` until it returns True (it may wait up to `budget_s` itself); returns the seconds waited.

    While the slot is busy, logs whom the run waits for (read with `holder()`) at once and then every
    `report_every_s`.

    Raises:
        ModelBusyError: after `timeout_s`, naming the holder.
    """
    t0 = time.monotonic()
    reported: float | None = None
    budget = min(_FIRST_TRY_S, timeout_s)
    while not take(budget):
        now = time.monotonic()
        if now - t0 >= timeout_s:
            raise ModelBusyError(
                f"{what} was held by {describe(holder())} for more than {timeout_s:.0f}s (publish.lock_timeout_s); "
                "wait for that run to finish, or raise publish.lock_timeout_s"
            )
        if reported is None or now - reported >= report_every_s:
            log.info("%s: waiting for %s", what, describe(holder()))
            reported = now
        budget = max(0.0, min(report_every_s - (now - reported), timeout_s - (now - t0)))
    return time.monotonic() - t0


def node_slot(
    layout: Layout,
    timeout_s: float,
    *,
    log: logging.Logger | logging.LoggerAdapter,
    flow_run: str | None = None,
    report_every_s: float = REPORT_EVERY_S,
) -> AbstractContextManager[Taken]:
    """The model's train/publish slot on this node (`NodeLayout.slot_lock`, the module docstring), a `file_lock`."""
    path = layout.node.slot_lock()
    return file_lock(
        path,
        what=f"the train/publish slot of model {layout.model_name!r} on this node ({path})",
        timeout_s=timeout_s,
        log=log,
        flow_run=flow_run,
        report_every_s=report_every_s,
    )


def day_lock(
    layout: Layout,
    date: str,
    timeout_s: float,
    *,
    log: logging.Logger | logging.LoggerAdapter,
    report_every_s: float = REPORT_EVERY_S,
) -> AbstractContextManager[Taken]:
    """The run of `date` of `layout`'s model on this node (`NodeLayout.day_lock`), a `file_lock`.

    A second run of the same model and date (a scheduled run and a manual retry) waits here, then finds the
    date completed, instead of sharing or deleting the first run's staging directories.
    """
    path = layout.node.day_lock(date)
    return file_lock(
        path,
        what=f"the run of {date} of model {layout.model_name!r} on this node ({path})",
        timeout_s=timeout_s,
        log=log,
        report_every_s=report_every_s,
    )


def data_lock(
    layout: Layout,
    date: str,
    timeout_s: float,
    *,
    log: logging.Logger | logging.LoggerAdapter,
    report_every_s: float = REPORT_EVERY_S,
) -> AbstractContextManager[Taken]:
    """The data stages of `date` on this node (`NodeLayout.data_lock`), for every model, a `file_lock`.

    Events are shared by the models of a root, and each data stage first removes the staging directories
    an earlier crashed writer left (`storage.io.fsio.remove_stale_staging`): two writers at once would
    remove each other's.  Held one stage at a time, never while waiting for another lock.
    """
    path = layout.node.data_lock(date)
    return file_lock(
        path,
        what=f"the data stages of {date} on this node ({path})",
        timeout_s=timeout_s,
        log=log,
        report_every_s=report_every_s,
    )


@contextmanager
def file_lock(
    path: str,
    *,
    what: str,
    timeout_s: float,
    log: logging.Logger | logging.LoggerAdapter,
    flow_run: str | None = None,
    report_every_s: float = REPORT_EVERY_S,
) -> Iterator[Taken]:
    """Hold an exclusive `flock` on `path` for the block, waiting as `wait_for_slot` says; the holder is written in it.

    The kernel drops the lock when the holding process exits, however it exits, so a killed run never
    blocks the next one.
    """
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the processes the run starts

    def take(budget_s: float) -> bool:
        deadline = time.monotonic() + budget_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_POLL_S)

    try:
        waited = wait_for_slot(
            take,
            lambda: Holder.from_json(Path(path).read_text()),
            what=what,
            timeout_s=timeout_s,
            log=log,
            report_every_s=report_every_s,
        )
        me = Holder.me(flow_run)
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.to_json().encode(), 0)
        try:
            yield Taken(me, waited)
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the lock
