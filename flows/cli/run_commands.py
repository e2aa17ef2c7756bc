"""The commands that run the daily flow through Prefect: `ctrpipe demo`, `run` and `backfill`.

Each checks what would fail later before Prefect starts (`flows.cli.preflight`), returns at once when
every date is already completed, and otherwise runs the flow with Ctrl-C and SIGTERM stopping all it
started (`flows.cli.interrupt`); a failed run raises `RunFailed` naming the date and the stage.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.cli.arguments import at_least_one, load_config_of
from flows.cli.errors import RunFailed, describe
from flows.cli.exit_codes import ExitCode
from flows.cli.parser import DEMO_START
from flows.cli.prefect_env import prefect_defaults
from flows.cli.table import format_table, where_line

log = logging.getLogger("ctrpipe")


def _failure(state: Any, date: str, record: Any) -> RunFailed:
    """The error of a failed daily run: the stage and its exception (chained, for --verbose)."""
    from flows.prefect.daily import DailyRunError

    cause = state.result(raise_on_failure=False)
    if isinstance(cause, DailyRunError) and (cause.__cause__ or cause.error):
        cause = cause.__cause__ or cause.error  # the stage's own error: this message names the date
    where = f" in {record.failed_stage}" if record and record.failed_stage else ""
    text = describe(cause) if isinstance(cause, BaseException) else (state.message or state.name)
    error = RunFailed(f"{date} failed{where}: {text}")
    if isinstance(cause, BaseException):
        error.__cause__ = cause
    return error


def _resume_line(args: argparse.Namespace) -> str:
    """The command line that resumes an interrupted run: the same one, without --force (which would redo it all)."""
    import shlex

    return shlex.join(["ctrpipe", *(a for a in args.argv if a != "--force")])


@contextmanager
def _guarded(args: argparse.Namespace) -> Iterator[None]:
    """Ctrl-C and SIGTERM stop the run with all it started, in one line saying how to resume (`flows.cli.interrupt`)."""
    from flows.cli.interrupt import stop_on_signals
    from flows.day.run import now_running

    with stop_on_signals(args.command, now_running, _resume_line(args)):
        yield


def _preflight(cfg: Any, dates: list[str], *, force: bool, inputs: bool = True) -> list[Any] | None:
    """Check what would fail later (`flows.cli.preflight`; the input files too unless not `inputs`); the dates'
    records when all are completed (nothing to do)."""
    from flows.cli.preflight import check_before_start, check_inputs, dates_done

    check_before_start(cfg)
    done = None if force else dates_done(cfg.layout(), dates)
    if done is None and inputs:
        check_inputs(cfg, dates, force=force)
    return done


def _nothing_to_do(records: list[Any]) -> None:
    for r in records:
        log.info(
            "%s already completed (%s %s); nothing to do (--force redoes it)", r.date, r.status, r.model_version or ""
        )


def cmd_run(args: argparse.Namespace) -> int:
    from storage.io.dates import validate_date

    validate_date(args.date)  # fail before Prefect starts
    cfg = load_config_of(args)
    if args.allow_older:
        from flows.config import with_overrides

        cfg = with_overrides(cfg, {"publish.allow_older": True})
    from flows.day.record import Status

    if done := _preflight(cfg, [args.date], force=args.force):  # nothing to do: no Prefect server, no cluster
        _nothing_to_do(done)
        print(format_table(done))
        return ExitCode.REFUSED if done[0].status == Status.REFUSED else ExitCode.OK
    prefect_defaults()
    with _guarded(args):
        from flows.prefect.daily import call_daily_retrain, model_tags, record_of

        with model_tags(cfg):
            state = call_daily_retrain(args.date, config=cfg.to_dict(), force=args.force, return_state=True)
    record = record_of(state, cfg.layout(), args.date)
    if state.is_completed() or (record and record.status in (Status.REFUSED, Status.CHECK_FAILED)):
        print(format_table([record]))
        if where := where_line(cfg.layout(), args.date):
            print(where)
        return ExitCode.OK if state.is_completed() else ExitCode.REFUSED
    raise _failure(state, args.date, record)


def cmd_backfill(args: argparse.Namespace) -> int:
    from storage.io.dates import date_range

    days = date_range(args.start, args.end)  # fail before Prefect starts
    cfg = load_config_of(args)
    if done := _preflight(cfg, days, force=args.force):  # nothing to do: no Prefect server, no cluster
        for r in done:
            log.info("backfill: %s already completed (%s %s); skipped", r.date, r.status, r.model_version or "")
        print(format_table(done))
        print(f"backfill: completed 0; skipped {len(done)}; refused 0; not run 0 (nothing to do)")
        return ExitCode.OK
    prefect_defaults()
    from flows.day.record import read_record

    with _guarded(args):
        from flows.prefect.daily import backfill, model_tags

        with model_tags(cfg):
            state = backfill(args.start, args.end, config=cfg.to_dict(), force=args.force, return_state=True)
    layout = cfg.layout()
    records = [r for d in date_range(args.start, args.end) if (r := read_record(layout, d)) and r.completed]
    if records:
        print(format_table(records))
        if state.is_completed() and (where := where_line(layout, records[-1].date)):
            print(where)
    if not state.is_completed():
        cause = state.result(raise_on_failure=False)
        raise RunFailed(describe(cause) if isinstance(cause, BaseException) else state.message) from (
            cause if isinstance(cause, BaseException) else None
        )
    report = state.result()
    print("backfill: " + "; ".join(f"{k.replace('_', ' ')} {len(v)}" for k, v in report.items()))
    return ExitCode.OK


def cmd_demo(args: argparse.Namespace) -> int:
    from flows.config import load_config, with_overrides
    from flows.presets import demo
    from pipeline.generate import generate_days
    from storage.io.dates import date_range, shift_date

    at_least_one(days=args.days, rows_per_day=args.rows_per_day)
    root = str(Path(args.root).resolve())
    cfg = load_config(None, args.overrides, base=demo(root))
    raw = Path(cfg.layout().raw())
    end = shift_date(DEMO_START, args.days - 1)
    cfg = with_overrides(cfg, {"input.url": str(raw / "day_{date}.tsv.gz")})
    days = date_range(DEMO_START, end)
    if done := _preflight(cfg, days, force=False, inputs=False):  # run again: no Prefect server, no cluster
        _nothing_to_do(done)
        records = done
    else:
        if not all((raw / f"day_{d}.tsv.gz").exists() for d in days):
            print(
                f"generating {args.days} days x {args.rows_per_day} rows of synthetic Criteo logs in {raw}", flush=True
            )
            generate_days(str(raw), args.days, args.rows_per_day, seed=0, start_date=DEMO_START)
        prefect_defaults(root)
        with _guarded(args):
            records = _demo_days(cfg, days)
    if len(records) > 1 or done:
        print("\nAll days:\n" + format_table(records))
    if records and (where := where_line(cfg.layout(), records[-1].date)):
        print(where)
    print(
        f"\nOutputs under {root}: events/ quarantine/ vocab/ features/ runs/ models/{cfg.model_name}/\n"
        f"Next: ctrpipe models list --preset demo --set root={root}"
    )
    return ExitCode.OK


def _demo_days(cfg: Any, days: list[str]) -> list[Any]:
    from flows.day.record import Status
    from flows.prefect.daily import call_daily_retrain, model_tags, record_of

    records = []
    for date in days:
        with model_tags(cfg):
            state = call_daily_retrain(date, config=cfg.to_dict(), return_state=True)
        record = record_of(state, cfg.layout(), date)
        if not state.is_completed() and not (record and record.status in (Status.REFUSED, Status.CHECK_FAILED)):
            raise _failure(state, date, record)
        records.append(record)
        print(format_table([record]), flush=True)
    return records
