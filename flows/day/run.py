"""`run_day(cfg, date)`: one date's run, stage after stage, with or without Prefect.

    ingest -> vocab -> encode           on one Dask client (pipeline/)
    checks                              the day's data against the trailing window (flows.guards.data_checks)
    [model slot]  read LATEST once -> warm -> train -> evaluate -> publish
    -> runs/<model>/date=D/metrics.json (the day's record) and history.png

A failed data check stops the day before the slot: its record says `check_failed` (not completed,
so the day runs again once the input is fixed or the check's action is changed).

The record's `seconds` hold each stage's wall time and the run's own overheads (`OVERHEADS`: the
flow's start, the Dask cluster's start and stop, the wait for the model's slot, the chart), each
timed where it happens, so that they add up to its `wall_s`.

A date whose record says `completed` is not run again unless `force`; every data stage also skips
itself when its committed output is already there, and train and publish reuse the candidate and
the registry version an interrupted run of the same work committed, so a rerun after a kill
resumes at the first stage that had not committed and ends with the uninterrupted run's result.
Two runs of one model and date at once (a scheduled run and a manual retry) never share a staging
directory: the second waits for the first at the date's lock (`flows.node.locks.day_lock`, seconds.day_wait),
logging whom it waits for once a minute, then finds the date completed; and each data stage holds the
date's data lock, which every model of the root takes (`flows.node.locks.data_lock`).
The runner decides how a stage is called: `call` calls it once and logs its summary (tests,
benchmarks, scripts); `flows.prefect.daily` runs each as a Prefect task with its retry policy.  The slot
keeps two runs of one model apart: the node's kernel lock by default (`flows.node.locks`), the Prefect
server's slot in front of it when the flow talks to a server (`flows.prefect.slot`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from flows.config import RunConfig, kept_line, lineage_config
from flows.day import stages
from flows.day.history import HISTORY_DAYS, write_history_png
from flows.day.record import (
    DayRecord,
    Status,
    read_record,
    recent_records,
    write_record,
)
from flows.day.state import DayState, read_published
from flows.node.locks import Taken, day_lock, node_slot
from pipeline.cluster import dask_client
from storage.io.dates import shift_date, validate_date
from storage.io.layout import Layout

log = logging.getLogger("ctrpipe")


@dataclass(frozen=True)
class Stage:
    """One stage of the run and its policy."""

    name: str
    fn: Callable[..., Any]
    retries: int
    """Attempts after the first when it fails with a transient I/O error (the Prefect runner applies it)."""
    uses_dask: bool = False
    field: str = ""
    """The `DayState` field its result goes to (default: `name`)."""

    @property
    def result_field(self) -> str:
        return self.field or self.name


DATA_STAGES = (
    Stage("ingest", stages.ingest, retries=2, uses_dask=True),
    Stage("vocab", stages.vocab, retries=2, uses_dask=True),
    Stage("encode", stages.encode, retries=2, uses_dask=True),
)
CHECK_STAGE = Stage("checks", stages.checks, retries=0)
MODEL_STAGES = (
    Stage("warm", stages.warm, retries=2),
    Stage("train", stages.train, retries=1),
    Stage("evaluate", stages.evaluate, retries=2, field="evaluation"),
    Stage("publish", stages.publish, retries=0),
)
STAGES = (*DATA_STAGES, CHECK_STAGE, *MODEL_STAGES)
OVERHEADS = ("prefect_start", "day_wait", "dask_start", "dask_stop", "slot_wait", "slot_release", "history")
"""The parts of a day's wall time that belong to no stage; `prefect_start` only when a flow called `run_day`."""


_now: dict[str, str] = {}
"""The date and stage a `run_day` of this process is in, for `now_running`."""


def now_running() -> str:
    """`<date> <stage>` of the stage a `run_day` of this process is in, else `startup`: what an interrupted
    `ctrpipe` run names (`flows.cli.interrupt`)."""
    return f"{_now['date']} {_now['stage']}" if _now else "startup"


class Runner(Protocol):
    def __call__(self, stage: Stage, cfg: RunConfig, state: DayState, **kw: Any) -> Any: ...


def call(stage: Stage, cfg: RunConfig, state: DayState, **kw: Any) -> Any:
    """Run `stage` once, here, and log its one-line summary."""
    t0 = time.perf_counter()
    result = stage.fn(cfg, state, **kw)
    log.info("%s (%.1fs)", result.summary(), time.perf_counter() - t0)
    return result


Slot = Callable[[RunConfig], AbstractContextManager[Taken]]


def local_slot(cfg: RunConfig) -> AbstractContextManager[Taken]:
    """The model's slot on this node (`flows.node.locks`), waiting runs logging to the `ctrpipe` logger."""
    return node_slot(cfg.layout(), cfg.publish.lock_timeout_s, log=log)


class DayClock:
    """Wall seconds of one run by part, and in all since `called_at` (`time.perf_counter()`; default: now).

    A `called_at` before now (the moment a flow was called) counts the time until the clock
    starts as `prefect_start`.
    """

    def __init__(self, called_at: float | None = None) -> None:
        now = time.perf_counter()
        self.started = now if called_at is None else called_at
        self.seconds: dict[str, float] = {} if called_at is None else {"prefect_start": round(now - called_at, 3)}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as `name` (also when it raises: a failed stage's time is part of the wall)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)

    def wall(self) -> float:
        return round(time.perf_counter() - self.started, 3)


@dataclass(frozen=True)
class DayRun:
    record: DayRecord
    ran: bool
    """False when the date had completed before and nothing was done."""


def run_day(
    cfg: RunConfig,
    date: str,
    *,
    force: bool = False,
    runner: Runner = call,
    slot: Slot = local_slot,
    called_at: float | None = None,
) -> DayRun:
    """Run every stage of `date` in order and write its record; see the module docstring.

    Args:
        called_at: `time.perf_counter()` when the caller's flow was called (`flows.prefect.daily`): the wall
            time starts there, and the time until this function starts is `seconds.prefect_start`.

    Raises:
        whatever a stage raised, after writing a `failed` record naming it.
    """
    clock = DayClock(called_at)
    layout = cfg.layout()
    validate_date(date)
    if not force and (done := read_record(layout, date)) is not None and done.completed:
        log.info(
            "%s already completed (%s %s); nothing to do (--force or force=true redoes it)",
            date,
            done.status,
            done.model_version or "",
        )
        return DayRun(done, ran=False)
    _now.update(date=date, stage="(waiting for the date's lock)")
    with ExitStack() as day:
        day.callback(_now.clear)
        with clock.part("day_wait"):
            day.enter_context(day_lock(layout, date, cfg.publish.lock_timeout_s, log=log))
        if not force and (done := read_record(layout, date)) is not None and done.completed:
            log.info(
                "%s completed meanwhile by the run this one waited for (%s %s); nothing to do",
                date,
                done.status,
                done.model_version or "",
            )
            return DayRun(done, ran=False)
        return _run_stages(cfg, date, force=force, runner=runner, slot=slot, clock=clock)


def _run_stages(cfg: RunConfig, date: str, *, force: bool, runner: Runner, slot: Slot, clock: DayClock) -> DayRun:
    """The stages of `run_day`, the date's lock held."""
    layout = cfg.layout()
    state = DayState(date=date, layout=layout, force=force)
    current = ""
    waited = 0.0

    def step(stage: Stage, **kw: Any) -> None:
        nonlocal state, current
        current = _now["stage"] = stage.name
        with clock.part(stage.name):
            result = runner(stage, cfg, state, **kw)
        state = state.with_result(stage.result_field, result)

    try:
        with ExitStack() as cluster:
            with clock.part("dask_start"):
                client = cluster.enter_context(dask_client(cfg.dask))
            for stage in DATA_STAGES:
                step(stage, client=client)
            with clock.part("dask_stop"):
                cluster.close()
        step(CHECK_STAGE)
        if state.checks.report.failed:
            return _finish(layout, check_failed_record(state, clock.seconds, clock.wall()), clock)
        with ExitStack() as held:
            _now["stage"] = "(waiting for the model's slot)"
            with clock.part("slot_wait"):
                taken = held.enter_context(slot(cfg))
            waited = round(taken.waited_s, 3)
            state = replace(state, published=read_published(layout, date=None if force else date))
            # the lineage keeps its network: shape keys not set take the published model's values
            cfg, kept = lineage_config(cfg, state.published.meta if state.published else None)
            if kept and state.published:
                log.info("%s", kept_line(state.published.version, kept))
            for stage in MODEL_STAGES:
                step(stage)
            with clock.part("slot_release"):
                held.close()
    except Exception as exc:
        write_record(
            layout,
            DayRecord(
                date=date,
                completed=False,
                status=Status.FAILED,
                failed_stage=current,
                reason=f"{type(exc).__name__}: {exc}",
                seconds=clock.seconds,
                wall_s=clock.wall(),
                slot_wait_s=waited,
            ),
        )
        raise
    return _finish(layout, day_record(state, clock.seconds, clock.wall(), waited), clock)


def _finish(layout: Layout, record: DayRecord, clock: DayClock) -> DayRun:
    with clock.part("history"):  # before the record: a run killed between the two is not completed
        history = [*recent_records(layout, shift_date(record.date, -1), HISTORY_DAYS - 1), record]
        write_history_png(layout, record.date, history)
    record = replace(record, seconds=dict(clock.seconds), wall_s=clock.wall())
    write_record(layout, record)
    return DayRun(record, ran=True)


def _data_fields(state: DayState) -> dict[str, Any]:
    """The record's fields that the data stages and the checks fill in."""
    ing, voc, enc, chk = state.ingest, state.vocab, state.encode, state.checks
    return {
        "rows_read": ing.rows_read,
        "rows_ingested": ing.rows_written,
        "rows_quarantined": ing.rows_quarantined,
        "rows_other_dates": ing.rows_other_dates,
        "vocab_size": voc.admitted,
        "rows_train": enc.rows_train,
        "rows_eval": enc.rows_eval,
        "checks": [r.to_dict() for r in chk.report.results],
        "checks_note": chk.report.note,
        "checks_window": list(chk.report.window),
        "data_stats": chk.stats,
    }


def check_failed_record(state: DayState, seconds: dict[str, float], wall_s: float) -> DayRecord:
    """The record of a day a data check stopped before training."""
    return DayRecord(
        date=state.date,
        completed=False,
        status=Status.CHECK_FAILED,
        reason=state.checks.report.reason(),
        seconds=dict(seconds),
        wall_s=wall_s,
        **_data_fields(state),
    )


def day_record(state: DayState, seconds: dict[str, float], wall_s: float, slot_wait_s: float = 0.0) -> DayRecord:
    """The record of a run whose stages all finished."""
    warmed, trained, ev, pub = state.warm, state.train, state.evaluation, state.publish
    return DayRecord(
        date=state.date,
        completed=True,
        status=Status.PUBLISHED if pub.published else Status.REFUSED,
        reason=pub.reason,
        auc=ev.new.auc,
        logloss=ev.new.logloss,
        published_auc=ev.published.auc if ev.published else None,
        next_day_auc=ev.next_day.auc if ev.next_day else None,
        published=pub.published,
        model_version=pub.version,
        latest_version=pub.latest,
        parent_version=trained.parent_version,
        train=trained.record(),
        warm=warmed.record(),
        evaluate=ev.record(),
        seconds=dict(seconds),
        wall_s=wall_s,
        gate=pub.checks,
        gate_verdict=pub.verdict,
        gate_evidence=pub.evidence,
        eval_positives=ev.positives,
        slot_wait_s=slot_wait_s,
        **_data_fields(state),
    )
