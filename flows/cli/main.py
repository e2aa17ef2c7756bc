"""`ctrpipe`: the command line of ctr-pipeline (`ctrpipe --help`, `ctrpipe COMMAND --help`).

    ctrpipe demo [--root DIR] [--days N]
    ctrpipe generate --out DIR --days N --rows-per-day R [--seed S] [--start-date D] [--interactions N]
    ctrpipe run --date D [--config FILE] [--preset NAME] [--set KEY=VALUE ...] [--force] [--allow-older]
    ctrpipe backfill --start D --end D [--config FILE] [--preset NAME] [--set ...] [--force]
    ctrpipe evaluate --model latest|VERSION --input URL [--format criteo|avazu|SCHEMA.yaml] [--predictions URL]
                     [--config FILE]
    ctrpipe models list|show VERSION|rollback VERSION|prune [--dry-run] [--config FILE] [--set ...]
    ctrpipe export --model latest|VERSION --out URL [--delta-from VERSION] [--dtype float16] [--onnx] [--config FILE]
    ctrpipe score-server [--model latest|VERSION | --bundle URL] [--host H] [--port P] [--reload-every S] [--mmap]
                         [--auth-token-env NAME] [--config FILE]
    ctrpipe deploy [--pool NAME] [--cron CRON] [--config FILE] [--set ...] [--no-alerts]
    ctrpipe serve [--cron CRON] [--config FILE] [--set ...]
    ctrpipe warm-node --spec URL --out FILE --nnodes N --my-addr ADDR --all-addrs A,B,...

Errors are one short message (what failed, the file/line/key, what to do) and an exit code from
`flows.cli.exit_codes`; `--verbose` or CTRPIPE_TRACEBACK=1 add the traceback and the libraries' logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.cli import console
from flows.cli.exit_codes import ExitCode
from flows.cli.parser import DEMO_START, build_parser

log = logging.getLogger("ctrpipe")

MAX_ERROR_LINES = 8
"""A longer error message (a trainer's output tail) keeps its first line and its last lines."""


class RunFailed(RuntimeError):
    """A daily run (or a backfill) ended in a failed state; the message says where and why."""


def _prefect_defaults(root: str | None = None) -> None:
    """Offline-friendly Prefect settings, applied only where the user set nothing (before prefect is imported)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    if root and "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_HOME"] = str(Path(root).resolve() / ".prefect")
    if "PREFECT_API_URL" not in os.environ:
        logging.getLogger("ctrpipe").info("starting a temporary Prefect server (set PREFECT_API_URL to use yours)")


def _load(args: argparse.Namespace) -> Any:
    from flows.config import load_config
    from flows.presets import by_name

    return load_config(args.config, args.overrides, base=by_name(args.preset))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        verbose = console.is_verbose(console.configure(verbose=args.verbose))
    except ValueError as exc:
        print(f"ctrpipe: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return int(code)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit flush must not fail again
        return ExitCode.BROKEN_PIPE
    except Exception as exc:
        if verbose or os.environ.get("CTRPIPE_TRACEBACK"):
            traceback.print_exception(exc, file=sys.stderr)
        print(f"ctrpipe {args.command}: error: {describe(exc)}", file=sys.stderr)
        if isinstance(exc, RunFailed) and not verbose:
            print("  (--verbose shows the run's full log)", file=sys.stderr)
        return ExitCode.FAILED


def describe(exc: BaseException) -> str:
    """The error as the user reads it: our messages say what to do, so the type name only where it helps."""
    text = str(exc).strip()
    if not isinstance(exc, ValueError | OSError | RuntimeError) or not text:
        text = f"{type(exc).__name__}: {text}".rstrip(": ")
    lines = text.splitlines()
    if len(lines) > MAX_ERROR_LINES:
        lines = [lines[0], "  ...", *lines[-(MAX_ERROR_LINES - 2) :]]
    return "\n".join(lines)


def _at_least_one(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


# ---- commands --------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    from pipeline.generate import generate_days
    from storage.io.dates import validate_date

    _at_least_one(days=args.days, rows_per_day=args.rows_per_day)
    validate_date(args.start_date)
    for day in generate_days(
        args.out,
        args.days,
        args.rows_per_day,
        seed=args.seed,
        start_date=args.start_date,
        interactions=args.interactions,
    ):
        print(f"{day.date}  {day.rows:>9} rows  click rate {day.click_rate:.3f}  {day.path}", flush=True)
    return ExitCode.OK


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


def _preflight(cfg: Any, dates: list[str], *, force: bool) -> list[Any] | None:
    """Check what would fail later (`flows.cli.preflight`); the dates'
    records when all are completed (nothing to do)."""
    from flows.cli.preflight import check_before_start, dates_done

    check_before_start(cfg)
    return None if force else dates_done(cfg.layout(), dates)


def _nothing_to_do(records: list[Any]) -> None:
    for r in records:
        log.info(
            "%s already completed (%s %s); nothing to do (--force redoes it)", r.date, r.status, r.model_version or ""
        )


def cmd_run(args: argparse.Namespace) -> int:
    from storage.io.dates import validate_date

    validate_date(args.date)  # fail before Prefect starts
    cfg = _load(args)
    if args.allow_older:
        from flows.config import with_overrides

        cfg = with_overrides(cfg, {"publish.allow_older": True})
    from flows.day.record import Status

    if done := _preflight(cfg, [args.date], force=args.force):  # nothing to do: no Prefect server, no cluster
        _nothing_to_do(done)
        print(format_table(done))
        return ExitCode.REFUSED if done[0].status == Status.REFUSED else ExitCode.OK
    _prefect_defaults()
    with _guarded(args):
        from flows.prefect.daily import call_daily_retrain, model_tags, record_of

        with model_tags(cfg):
            state = call_daily_retrain(args.date, config=cfg.to_dict(), force=args.force, return_state=True)
    record = record_of(state, cfg.layout(), args.date)
    if state.is_completed() or (record and record.status in (Status.REFUSED, Status.CHECK_FAILED)):
        print(format_table([record]))
        return ExitCode.OK if state.is_completed() else ExitCode.REFUSED
    raise _failure(state, args.date, record)


def cmd_backfill(args: argparse.Namespace) -> int:
    from storage.io.dates import date_range

    days = date_range(args.start, args.end)  # fail before Prefect starts
    cfg = _load(args)
    if done := _preflight(cfg, days, force=args.force):  # nothing to do: no Prefect server, no cluster
        for r in done:
            log.info("backfill: %s already completed (%s %s); skipped", r.date, r.status, r.model_version or "")
        print(format_table(done))
        print(f"backfill: completed 0; skipped {len(done)}; refused 0; not run 0 (nothing to do)")
        return ExitCode.OK
    _prefect_defaults()
    from flows.day.record import read_record

    with _guarded(args):
        from flows.prefect.daily import backfill, model_tags

        with model_tags(cfg):
            state = backfill(args.start, args.end, config=cfg.to_dict(), force=args.force, return_state=True)
    layout = cfg.layout()
    records = [r for d in date_range(args.start, args.end) if (r := read_record(layout, d)) and r.completed]
    if records:
        print(format_table(records))
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

    _at_least_one(days=args.days, rows_per_day=args.rows_per_day)
    root = str(Path(args.root).resolve())
    cfg = load_config(None, args.overrides, base=demo(root))
    raw = Path(cfg.layout().raw())
    end = shift_date(DEMO_START, args.days - 1)
    cfg = with_overrides(cfg, {"input.url": str(raw / "day_{date}.tsv.gz")})
    days = date_range(DEMO_START, end)
    if done := _preflight(cfg, days, force=False):  # run again: no Prefect server, no cluster
        _nothing_to_do(done)
        records = done
    else:
        if not all((raw / f"day_{d}.tsv.gz").exists() for d in days):
            print(
                f"generating {args.days} days x {args.rows_per_day} rows of synthetic Criteo logs in {raw}", flush=True
            )
            generate_days(str(raw), args.days, args.rows_per_day, seed=0, start_date=DEMO_START)
        _prefect_defaults(root)
        with _guarded(args):
            records = _demo_days(cfg, days)
    if len(records) > 1 or done:
        print("\nAll days:\n" + format_table(records))
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


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from flows.cli.evaluate_file import evaluate_log

    print(
        json.dumps(
            evaluate_log(
                cfg,
                args.model,
                args.input,
                args.format or cfg.input.format,
                format_key="--format" if args.format else "input.format",
                predictions_url=args.predictions,
            )
        )
    )
    return ExitCode.OK


def cmd_models(args: argparse.Namespace) -> int:
    from storage.io.registry import ModelRegistry

    cfg = _load(args)
    reg = ModelRegistry(cfg.layout())
    if args.action == "list":
        versions = reg.versions()
        if not versions:
            print(
                f"no versions of model {cfg.model_name} under {cfg.layout().models()} (the config's root); "
                "point elsewhere with --config FILE, --set root=DIR, or --preset demo for ./demo-data",
                file=sys.stderr,
            )
            return ExitCode.OK
        latest = reg.latest()
        for v in versions:
            info = reg.info(v)
            mark = "*" if v == latest else " "
            auc = info.metrics.get("auc")
            print(
                f"{mark} {v}  {info.status:<9} {info.metrics.get('date', ''):<10} "
                f"auc={'-' if auc is None else f'{auc:.4f}'}  bytes={reg.version_bytes(v)}  "
                f"bundle={reg.bundle_bytes(v)}  {info.reason}".rstrip()
            )
        return ExitCode.OK
    if args.action == "prune":
        return _models_prune(reg, cfg, dry_run=args.dry_run)
    if not args.version:
        raise ValueError(
            f"models {args.action} needs a VERSION (v00003, latest or previous); see `ctrpipe models list`"
        )
    if args.action == "show":
        from flows.serving.export import bundle_sizes

        version = reg.resolve(args.version)
        info = reg.info(version)
        print(
            json.dumps(
                {
                    "version": info.version,
                    "status": info.status,
                    "reason": info.reason,
                    "created": info.created,
                    "metrics": info.metrics,
                    "bytes": reg.version_bytes(version),
                    "bundle": bundle_sizes(reg.layout, version),
                    "lineage": reg.read_json(version, "lineage.json"),
                },
                indent=2,
                default=str,
            )
        )
        return ExitCode.OK
    before = reg.latest()
    version = reg.resolve(args.version)
    reg.rollback(version)
    print(f"LATEST -> {version}" + ("" if before in (None, version) else f" (was {before})"))
    from flows.serving.export import ExportError, point_servers_at

    try:
        point_servers_at(reg.layout, version)
        print(f"servers -> {version} (bundles/{reg.model_name}/LATEST)")
    except ExportError as exc:
        print(f"servers not moved: {exc}", file=sys.stderr)
    return ExitCode.OK


def _models_prune(reg: Any, cfg: Any, *, dry_run: bool) -> int:
    plan = reg.prune(cfg.registry, dry_run=dry_run)
    for v, why in plan.keep.items():
        print(f"keep    {v}  {why}")
    for v in plan.delete:
        print(f"{'would delete' if dry_run else 'deleted'} {v}")
    for d in plan.delete_deltas:
        print(f"{'would delete' if dry_run else 'deleted'} delta {d}")
    print(f"{plan.freed_bytes} bytes {'would be ' if dry_run else ''}freed")
    return ExitCode.OK


# ---- serving ---------------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    from flows.serving.export import export_version
    from storage.io.registry import ModelRegistry

    layout = _load(args).layout()
    version = ModelRegistry(layout).resolve(args.model)
    manifest = export_version(layout, version, args.out, delta_from=args.delta_from, dtype=args.dtype, onnx=args.onnx)
    keys = (
        "version",
        "kind",
        "base_version",
        "rows",
        "table_rows",
        "evicted",
        "dtype",
        "bytes_total",
        "registry_version_bytes",
        "dtype_auc",
    )
    print(json.dumps({k: manifest.get(k) for k in keys} | {"out": args.out}, default=str))
    return ExitCode.OK


def cmd_score_server(args: argparse.Namespace) -> int:
    import logging

    from flows.serving.reload import BundleSource
    from flows.serving.server import ServeConfig, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServeConfig(
        host=args.host,
        port=args.port,
        reload_every_s=args.reload_every,
        max_body_bytes=args.max_body_bytes,
        max_lines=args.max_lines,
        max_batch_rows=args.max_batch_rows,
        max_wait_ms=args.max_wait_ms,
        auth_token_env=args.auth_token_env,
        access_log=args.access_log,
    )
    if args.bundle:
        source = BundleSource(bundle_url=args.bundle, mmap=args.mmap)
    else:
        source = BundleSource(layout=_load(args).layout(), version=args.model, mmap=args.mmap)
    serve(source, config)
    return ExitCode.OK


def cmd_deploy(args: argparse.Namespace) -> int:
    cfg = _load(args)
    if "PREFECT_API_URL" not in os.environ:
        raise ValueError("set PREFECT_API_URL to the Prefect server to deploy to (e.g. http://127.0.0.1:4200/api)")
    from flows.prefect.deploy import DEFAULT_POOL, REPO, deploy_all
    from flows.prefect.keys import config_digest
    from flows.security import redacted

    config = cfg.to_dict()
    if redacted(config) != config:
        raise ValueError("config holds credential-like values; put credentials in the environment, not in deployments")
    ids = deploy_all(
        config,
        pool=args.pool,
        cron=args.cron,
        source=args.source or REPO,
        alerts=not args.no_alerts,
        create_pool=args.pool == DEFAULT_POOL,
    )
    for name, dep_id in ids.items():
        print(f"deployed {name}: {dep_id}")
    print(f"config {config_digest(config)} is frozen into the deployments: after editing it, run deploy again")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return ExitCode.OK


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _prefect_defaults()
    from flows.prefect.deploy import serve_all

    serve_all(cfg.to_dict(), cron=args.cron, alerts=not args.no_alerts)
    return ExitCode.OK


def cmd_warm_node(args: argparse.Namespace) -> int:
    from flows.node.warm_node import warm_node

    report = warm_node(
        args.spec,
        args.out,
        nnodes=args.nnodes,
        nproc_per_node=args.nproc_per_node,
        my_addr=args.my_addr,
        all_addrs=args.all_addrs.split(","),
        warm=not args.skip_warm,
        env_file=args.env_file,
    )
    print(json.dumps(report, default=str))
    return ExitCode.OK


_COMMANDS = {
    "deploy": cmd_deploy,
    "serve": cmd_serve,
    "demo": cmd_demo,
    "generate": cmd_generate,
    "run": cmd_run,
    "backfill": cmd_backfill,
    "evaluate": cmd_evaluate,
    "models": cmd_models,
    "warm-node": cmd_warm_node,
    "export": cmd_export,
    "score-server": cmd_score_server,
}


def format_table(records: list[Any]) -> str:
    """The per-day summary users read (`DayRecord`s): rows, vocabulary, metrics, publish outcome."""
    from flows.day.record import Status

    shown = {Status.PUBLISHED: "yes", Status.REFUSED: "REFUSED", Status.CHECK_FAILED: "STOPPED"}
    head = ("date", "ingested", "quarant.", "vocab", "train", "eval", "AUC", "logloss", "published", "version")
    rows = [head] + [
        (
            r.date,
            str(r.rows_ingested),
            str(r.rows_quarantined),
            str(r.vocab_size),
            str(r.rows_train),
            str(r.rows_eval),
            "-" if r.auc is None else f"{r.auc:.4f}",
            "-" if r.logloss is None else f"{r.logloss:.4f}",
            shown.get(r.status, r.status),
            str(r.model_version or "-"),
        )
        for r in records
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    refused = [f"  {r.date}: {r.status}: {r.reason}" for r in records if r.status != Status.PUBLISHED]
    return out + ("\n" + "\n".join(refused) if refused else "")


if __name__ == "__main__":
    sys.exit(main())
