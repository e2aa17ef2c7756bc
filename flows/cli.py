"""`ctrpipe`: the command line of ctr-pipeline (`ctrpipe --help`, `ctrpipe COMMAND --help`).

    ctrpipe demo [--root DIR] [--days N]
    ctrpipe generate --out DIR --days N --rows-per-day R [--seed S] [--start-date D] [--interactions N]
    ctrpipe run --date D [--config FILE] [--recipe NAME] [--set KEY=VALUE ...] [--force] [--allow-older]
    ctrpipe backfill --start D --end D [--config FILE] [--recipe NAME] [--set ...] [--force]
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
`flows.exit_codes`; `--verbose` or CTRPIPE_TRACEBACK=1 add the traceback and the libraries' logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

from flows import console
from flows.exit_codes import ExitCode, help_text

DEMO_START = "2026-01-01"
DEMO_ROWS_PER_DAY = 20_000
MAX_ERROR_LINES = 8
"""A longer error message (a trainer's output tail) keeps its first line and its last lines."""
DATE_HELP = "YYYY-MM-DD"
ENVIRONMENT_HELP = """environment:
  CTRPIPE_TRACEBACK=1     print the traceback of an error as well as its message
  CTRPIPE_LOG_LEVEL=LEVEL debug, info (= --verbose), warning (default) or error: Prefect's, Dask's and the
                          trainer's own log lines
  CTRPIPE_PROGRESS=off    no progress bars (they are drawn only on a terminal anyway)
  PREFECT_API_URL=URL     run against that Prefect server instead of a temporary local one"""


class RunFailed(RuntimeError):
    """A daily run (or a backfill) ended in a failed state; the message says where and why."""


class _Help(argparse.HelpFormatter):
    """Wraps prose paragraphs to the terminal; keeps paragraphs with indented lines (examples, tables) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            if any(line.startswith(" ") for line in para.splitlines()):
                paragraphs.append("\n".join(indent + line for line in para.splitlines()))
            else:
                paragraphs.append(super()._fill_text(para, width, indent))
        return "\n\n".join(paragraphs)


class _Parser(argparse.ArgumentParser):
    """argparse with our usage exit code: its own 2 would read as "refused" (`flows.exit_codes`)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _prefect_defaults(root: str | None = None) -> None:
    """Offline-friendly Prefect settings, applied only where the user set nothing (before prefect is imported)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    if root and "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_HOME"] = str(Path(root).resolve() / ".prefect")
    if "PREFECT_API_URL" not in os.environ:
        logging.getLogger("ctrpipe").info("starting a temporary Prefect server (set PREFECT_API_URL to use yours)")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="YAML file of config sections over the recipe (docs/config-reference.md lists every key; "
                        "infra/prod.example.yaml is a commented example)")
    p.add_argument("--recipe", default="default", metavar="NAME",
                   help="base configuration: default (production sizes) or demo (a tiny model, ./demo-data); "
                        "default: %(default)s")
    _add_set(p)


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config key, value parsed as YAML, e.g. --set optim.k_steps=20 "
                        "or --set root=s3://bucket/ctr (repeatable; applied last)")


def _load(args: argparse.Namespace) -> Any:
    from flows.config import load_config
    from flows.recipes import by_name

    return load_config(args.config, args.overrides, base=by_name(args.recipe))


def _command(sub: Any, name: str, summary: str, description: str, examples: list[str]) -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    return sub.add_parser(name, help=summary, description=description, epilog=epilog,
                          formatter_class=_Help, parents=[_common()])


def _common() -> argparse.ArgumentParser:
    """Options every command takes (also accepted before the command)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="show Prefect's, Dask's and the trainer's log lines, and tracebacks of errors")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ctrpipe", formatter_class=_Help,
        description="Daily CTR model retraining: ingest raw ad logs, build vocabularies, train, evaluate, "
                    "publish the model when it is not worse.  Dates are " + DATE_HELP + ".",
        epilog="first steps:\n  ctrpipe demo                       3 synthetic days end to end in ./demo-data\n"
               "  ctrpipe models list --recipe demo  the versions the demo published\n"
               "  cp infra/prod.example.yaml prod.yaml; ctrpipe run --date 2026-03-01 --config prod.yaml\n"
               "  ctrpipe COMMAND --help             what a command does, with examples\n\n"
               + help_text() + "\n\n" + ENVIRONMENT_HELP,
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=False,
                        help="show Prefect's, Dask's and the trainer's log lines, and tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    p = _command(sub, "demo", "generate a tiny dataset and run the daily flow for each day",
                 "Generate synthetic Criteo-format logs for N days from " + DEMO_START + " under ROOT/raw/ (kept "
                 "when they are there), then run the daily flow for each day in order and print each day's "
                 "table.  Prefect runs a temporary local server; nothing else is needed.",
                 ["ctrpipe demo", "ctrpipe demo --root /tmp/ctr-demo --days 5 --rows-per-day 50000"])
    p.add_argument("--root", default="./demo-data", metavar="DIR",
                   help="folder of the generated logs and every output (default: %(default)s)")
    p.add_argument("--days", type=int, default=3, metavar="N", help="days to generate and run (default: %(default)s)")
    p.add_argument("--rows-per-day", type=int, default=DEMO_ROWS_PER_DAY, metavar="R",
                   help="rows of each generated day (default: %(default)s)")
    _add_set(p)

    p = _command(sub, "generate", "write synthetic Criteo-format day files",
                 "Write day_YYYY-MM-DD.tsv.gz files of synthetic Criteo logs (label, 13 integer and 26 categorical "
                 "fields, missing values, power-law value frequencies, new values day by day, clicks from a "
                 "planted model).  The same seed writes the same files.",
                 ["ctrpipe generate --out ./raw --days 7 --rows-per-day 100000"])
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the day files into")
    p.add_argument("--days", type=int, required=True, metavar="N", help="number of consecutive days")
    p.add_argument("--rows-per-day", type=int, required=True, metavar="R", help="rows of each day")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--start-date", default=DEMO_START, metavar="D",
                   help=f"first day, {DATE_HELP} (default: %(default)s)")
    p.add_argument("--interactions", type=int, default=0, metavar="N",
                   help="plant N pairwise field interactions and one three-way term in the click model "
                        "(default: %(default)s, the additive model)")

    p = _command(sub, "run", "retrain on one day through the Prefect flow",
                 "Retrain on one day of logs: ingest, vocab, encode, warm, train, evaluate, publish.  The model "
                 "is published when the gate passes; exit code 2 when it refused the model (LATEST unchanged).  "
                 "A completed date is not redone unless --force.  Prints the day's table.",
                 ["ctrpipe run --date 2026-01-01 --recipe demo", "ctrpipe run --date 2026-03-01 --config prod.yaml",
                  "ctrpipe run --date 2026-03-01 --config prod.yaml --set optim.k_steps=20 --force"])
    p.add_argument("--date", required=True, metavar="D", help=f"the day whose logs to train on, {DATE_HELP}")
    p.add_argument("--force", action="store_true", help="redo the date even if it completed, recomputing every stage")
    p.add_argument("--allow-older", action="store_true",
                   help="let a model trained on a date older than LATEST's become LATEST (publish.allow_older)")
    _add_config_args(p)

    p = _command(sub, "backfill", "the daily flow for each date of a range, in order",
                 "Run the daily flow for each date from --start to --end (both included) in order: each day "
                 "warm-starts from the model before it.  Completed dates are skipped; a failed date stops the "
                 "backfill, and rerunning the same command resumes at it.",
                 ["ctrpipe backfill --start 2026-03-01 --end 2026-03-07 --config prod.yaml"])
    p.add_argument("--start", required=True, metavar="D", help=f"first date, {DATE_HELP}")
    p.add_argument("--end", required=True, metavar="D", help=f"last date (included), {DATE_HELP}")
    p.add_argument("--force", action="store_true", help="redo completed dates too (no ingest ahead)")
    _add_config_args(p)

    p = _command(sub, "evaluate", "score a registry model on a log file; prints JSON",
                 "Score a registry model on one raw log file, encoded with the model's own vocabulary.  "
                 'Prints one JSON line: {"auc", "logloss", "rows", "rows_quarantined", "model"}.',
                 ["ctrpipe evaluate --input ./demo-data/raw/day_2026-01-03.tsv.gz --recipe demo",
                  "ctrpipe evaluate --model v00002 --input s3://logs/2026-03-02.csv --format shop.yaml --config prod.yaml"])
    p.add_argument("--model", default="latest", metavar="VERSION",
                   help="latest (the published model, default) or a version such as v00003")
    p.add_argument("--input", required=True, metavar="URL", help="path or fsspec URL of a raw log file (.gz/.bz2 read as such)")
    p.add_argument("--format", default=None, metavar="FORMAT",
                   help="criteo, avazu or a schema file (.yaml) describing the file; default: the config's input.format")
    p.add_argument("--predictions", default=None, metavar="URL",
                   help="also write line number, label and score of every row here (Parquet)")
    _add_config_args(p)

    p = _command(sub, "models", "list, show, roll back or prune registry versions",
                 "The model registry under ROOT/models/NAME/: `list` its versions (* marks LATEST) with status, "
                 "date, AUC and bytes; `show` one version's metrics, lineage and bundle sizes as JSON; `rollback` "
                 "moves LATEST (and the servers' bundle pointer) to an earlier published version, atomically; "
                 "`prune` applies the retention of the registry section (also run after each publish).",
                 ["ctrpipe models list --recipe demo", "ctrpipe models show latest --config prod.yaml",
                  "ctrpipe models rollback previous --config prod.yaml", "ctrpipe models prune --dry-run --recipe demo"])
    p.add_argument("action", choices=["list", "show", "rollback", "prune"],
                   help="list | show VERSION | rollback VERSION | prune")
    p.add_argument("version", nargs="?", metavar="VERSION",
                   help="v00003, latest, or previous (the published version before LATEST)")
    p.add_argument("--dry-run", action="store_true", help="prune: only say what would be deleted")
    _add_config_args(p)

    _add_serving_parsers(sub)

    p = _command(sub, "deploy", "register the model's daily / on-demand / backfill deployments on a Prefect server",
                 "Register the model's three deployments on the Prefect server at PREFECT_API_URL: `<model>-daily` "
                 "(cron, UTC: the day before the scheduled time), `<model>-on-demand` (a date) and `<model>-backfill` "
                 "(a range), and its alert automations (see the alerts section).  Rerunning updates them.  Creates "
                 "the process work pool if missing; a worker then runs them.",
                 ["ctrpipe deploy --config prod.yaml      # with PREFECT_API_URL=http://127.0.0.1:4200/api set",
                  "ctrpipe deploy --config prod.yaml --pool ctr-k8s --cron '30 1 * * *'"])
    p.add_argument("--pool", default="ctr-process", help="work pool (created as a process pool if missing; default: %(default)s)")
    p.add_argument("--cron", default="0 2 * * *", help="schedule of the daily deployment, UTC (default: %(default)s)")
    p.add_argument("--source", default=None, metavar="DIR", help="code folder the worker runs from (default: this checkout)")
    p.add_argument("--no-alerts", action="store_true", help="create no alert automations (see the alerts section)")
    _add_config_args(p)

    p = _command(sub, "serve", "serve the deployments from this process (no worker needed)",
                 "Serve the daily, on-demand and backfill deployments from this process until stopped (Ctrl-C): "
                 "the single-process alternative to `deploy` and a worker.",
                 ["ctrpipe serve --config prod.yaml --cron '0 3 * * *'"])
    p.add_argument("--cron", default="0 2 * * *", help="schedule of the daily deployment, UTC (default: %(default)s)")
    _add_config_args(p)

    p = _command(
        sub, "warm-node", "before torchrun on one node of a multi-node job: fetch the train spec, warm this node's shards",
        "Run once per node before that node's torchrun (infra/slurm/train.sbatch and infra/k8s/train-job.yaml do).  "
        "torchrun's c10d rendezvous numbers nodes by the sorted order of their --local_addr strings, so pass each "
        "node's address here and to torchrun: the node's ranks follow from it.",
        ["ctrpipe warm-node --spec s3://ctr/runs/ctr/date=2026-03-01/train-spec.json --out /tmp/spec.json "
         "--nnodes 2 --my-addr 10.0.0.5 --all-addrs 10.0.0.5,10.0.0.6"],
    )
    p.add_argument("--spec", required=True, help="train spec JSON (runs/<model>/date=D/train-spec.json): a path or fsspec URL")
    p.add_argument("--out", required=True, help="local path to copy the spec to (what trainer.main reads)")
    p.add_argument("--nnodes", type=int, required=True, help="nodes in the job; must equal the spec's trainer.nnodes")
    p.add_argument("--nproc-per-node", type=int, default=0, help="check against the spec (0: take the spec's)")
    p.add_argument("--my-addr", required=True, help="this node's --local_addr given to torchrun")
    p.add_argument("--all-addrs", required=True, help="comma-separated --local_addr of every node")
    p.add_argument("--env-file", default=None,
                   help="write the spec's environment of the ranks (trainer.nccl_env, ...) here, to source before torchrun")
    p.add_argument("--skip-warm", action="store_true", help="only fetch and check the spec")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        lines = [lines[0], "  ...", *lines[-(MAX_ERROR_LINES - 2):]]
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
    for day in generate_days(args.out, args.days, args.rows_per_day, seed=args.seed, start_date=args.start_date,
                             interactions=args.interactions):
        print(f"{day.date}  {day.rows:>9} rows  click rate {day.click_rate:.3f}  {day.path}", flush=True)
    return ExitCode.OK


def _failure(state: Any, date: str, record: Any) -> RunFailed:
    """The error of a failed daily run: the stage and its exception (chained, for --verbose)."""
    from flows.daily import DailyRunError

    cause = state.result(raise_on_failure=False)
    if isinstance(cause, DailyRunError) and (cause.__cause__ or cause.error):
        cause = cause.__cause__ or cause.error  # the stage's own error: this message names the date
    where = f" in {record.failed_stage}" if record and record.failed_stage else ""
    text = describe(cause) if isinstance(cause, BaseException) else (state.message or state.name)
    error = RunFailed(f"{date} failed{where}: {text}")
    if isinstance(cause, BaseException):
        error.__cause__ = cause
    return error


def cmd_run(args: argparse.Namespace) -> int:
    from storage.io.dates import validate_date

    validate_date(args.date)  # fail before Prefect starts
    cfg = _load(args)
    if args.allow_older:
        from flows.config import with_overrides

        cfg = with_overrides(cfg, {"publish.allow_older": True})
    _prefect_defaults()
    from flows.daily import call_daily_retrain, model_tags, record_of
    from flows.record import Status

    with model_tags(cfg):
        state = call_daily_retrain(args.date, config=cfg.to_dict(), force=args.force, return_state=True)
    record = record_of(state, cfg.layout(), args.date)
    if state.is_completed() or (record and record.status in (Status.REFUSED, Status.CHECK_FAILED)):
        print(format_table([record]))
        return ExitCode.OK if state.is_completed() else ExitCode.REFUSED
    raise _failure(state, args.date, record)


def cmd_backfill(args: argparse.Namespace) -> int:
    from storage.io.dates import date_range

    date_range(args.start, args.end)  # fail before Prefect starts
    cfg = _load(args)
    _prefect_defaults()
    from flows.daily import backfill, model_tags
    from flows.record import read_record

    with model_tags(cfg):
        state = backfill(args.start, args.end, config=cfg.to_dict(), force=args.force, return_state=True)
    layout = cfg.layout()
    records = [r for d in date_range(args.start, args.end) if (r := read_record(layout, d)) and r.completed]
    if records:
        print(format_table(records))
    if not state.is_completed():
        cause = state.result(raise_on_failure=False)
        raise RunFailed(describe(cause) if isinstance(cause, BaseException) else state.message) from (
            cause if isinstance(cause, BaseException) else None)
    report = state.result()
    print("backfill: " + "; ".join(f"{k.replace('_', ' ')} {len(v)}" for k, v in report.items()))
    return ExitCode.OK


def cmd_demo(args: argparse.Namespace) -> int:
    from flows.config import load_config, with_overrides
    from flows.recipes import demo
    from pipeline.generate import generate_days
    from storage.io.dates import date_range, shift_date

    _at_least_one(days=args.days, rows_per_day=args.rows_per_day)
    root = str(Path(args.root).resolve())
    cfg = load_config(None, args.overrides, base=demo(root))
    _prefect_defaults(root)
    raw = Path(cfg.layout().raw())
    end = shift_date(DEMO_START, args.days - 1)
    if not all((raw / f"day_{d}.tsv.gz").exists() for d in date_range(DEMO_START, end)):
        print(f"generating {args.days} days x {args.rows_per_day} rows of synthetic Criteo logs in {raw}", flush=True)
        generate_days(str(raw), args.days, args.rows_per_day, seed=0, start_date=DEMO_START)
    cfg = with_overrides(cfg, {"input.url": str(raw / "day_{date}.tsv.gz")})

    from flows.daily import call_daily_retrain, model_tags, record_of
    from flows.record import Status

    records = []
    for date in date_range(DEMO_START, end):
        with model_tags(cfg):
            state = call_daily_retrain(date, config=cfg.to_dict(), return_state=True)
        record = record_of(state, cfg.layout(), date)
        if not state.is_completed() and not (record and record.status in (Status.REFUSED, Status.CHECK_FAILED)):
            raise _failure(state, date, record)
        records.append(record)
        print(format_table([record]), flush=True)
    if len(records) > 1:
        print("\nAll days:\n" + format_table(records))
    print(f"\nOutputs under {root}: events/ quarantine/ vocab/ features/ runs/ models/{cfg.model_name}/\n"
          f"Next: ctrpipe models list --recipe demo --set root={root}")
    return ExitCode.OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from flows.evaluate_file import evaluate_log

    print(json.dumps(evaluate_log(cfg, args.model, args.input, args.format or cfg.input.format,
                                  format_key="--format" if args.format else "input.format",
                                  predictions_url=args.predictions)))
    return ExitCode.OK


def cmd_models(args: argparse.Namespace) -> int:
    from storage.io.registry import ModelRegistry

    cfg = _load(args)
    reg = ModelRegistry(cfg.layout())
    if args.action == "list":
        versions = reg.versions()
        if not versions:
            print(f"no versions of model {cfg.model_name} under {cfg.layout().models()} (the config's root); "
                  "point elsewhere with --config FILE, --set root=DIR, or --recipe demo for ./demo-data",
                  file=sys.stderr)
            return ExitCode.OK
        latest = reg.latest()
        for v in versions:
            info = reg.info(v)
            mark = "*" if v == latest else " "
            auc = info.metrics.get("auc")
            print(f"{mark} {v}  {info.status:<9} {info.metrics.get('date', ''):<10} "
                  f"auc={'-' if auc is None else f'{auc:.4f}'}  bytes={reg.version_bytes(v)}  "
                  f"bundle={reg.bundle_bytes(v)}  {info.reason}".rstrip())
        return ExitCode.OK
    if args.action == "prune":
        return _models_prune(reg, cfg, dry_run=args.dry_run)
    if not args.version:
        raise ValueError(f"models {args.action} needs a VERSION (v00003, latest or previous); see `ctrpipe models list`")
    if args.action == "show":
        from flows.serving.export import bundle_sizes

        version = reg.resolve(args.version)
        info = reg.info(version)
        print(json.dumps({"version": info.version, "status": info.status, "reason": info.reason,
                          "created": info.created, "metrics": info.metrics, "bytes": reg.version_bytes(version),
                          "bundle": bundle_sizes(reg.layout, version),
                          "lineage": reg.read_json(version, "lineage.json")}, indent=2, default=str))
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
def _add_serving_parsers(sub: Any) -> None:
    p = _command(sub, "export", "write the serving bundle of a registry version (full, or a delta)",
                 "Write the serving bundle of a registry version: the network as torch.export .pt2 (and ONNX with "
                 "--onnx), the embedding rows without optimizer state, the feature spec frozen from the model's "
                 "vocabulary and a manifest with checksums.  Publishing writes the bundles of each published "
                 "version already (ROOT/bundles/NAME/); this is for another dtype, ONNX or a delta from any base.",
                 ["ctrpipe export --model latest --out ./bundle --recipe demo",
                  "ctrpipe export --model v00004 --delta-from v00002 --out s3://b/ctr/d4 --config prod.yaml",
                  "ctrpipe export --model latest --out ./bundle16 --dtype float16 --recipe demo"])
    p.add_argument("--model", default="latest", metavar="VERSION", help="latest, previous or a version such as v00003")
    p.add_argument("--out", required=True, help="the bundle directory to write: a path or fsspec URL")
    p.add_argument("--delta-from", default=None, metavar="VERSION",
                   help="only the rows changed (by clock) or evicted since VERSION, plus the network")
    p.add_argument("--dtype", choices=["float32", "float16"], default="float32",
                   help="row dtype (float16: the AUC change it causes is recorded in the manifest)")
    p.add_argument("--onnx", action="store_true", help="also export dense.onnx (needs the onnx extra)")
    _add_config_args(p)

    p = _command(sub, "score-server", "serve a bundle over HTTP: POST /v1/score, with hot reload",
                 "Serve the published model over HTTP: POST /v1/score with raw log lines or rows, GET /v1/model, "
                 "/healthz and /readyz.  Follows ROOT/bundles/NAME/LATEST (polled every --reload-every seconds): a "
                 "new version is loaded beside the old one, checked with a smoke score, and switched to "
                 "atomically; a bundle that fails is refused and the old one keeps serving.",
                 ["ctrpipe score-server --recipe demo --set root=./demo-data",
                  "ctrpipe score-server --bundle ./bundle --port 8080",
                  "ctrpipe score-server --config prod.yaml --host 0.0.0.0 --auth-token-env SCORER_TOKEN   # token in $SCORER_TOKEN"])
    p.add_argument("--model", default="latest", metavar="VERSION",
                   help="latest (follow bundles/<model>/LATEST) or a version (pinned)")
    p.add_argument("--bundle", default=None, metavar="URL", help="serve this bundle directory (pinned; no root needed)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    p.add_argument("--reload-every", type=float, default=30.0, metavar="SECONDS", help="poll period of LATEST")
    p.add_argument("--mmap", action="store_true", help="serve the rows memory-mapped (tables larger than RAM)")
    p.add_argument("--auth-token-env", default="", metavar="NAME",
                   help="require Authorization: Bearer <token>, the token read from this environment variable")
    p.add_argument("--max-lines", type=int, default=10_000, help="most lines or rows per request")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest request body")
    p.add_argument("--max-batch-rows", type=int, default=4096, help="rows above which requests stop joining a batch")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="how long a batch waits for more requests")
    _add_config_args(p)


def cmd_export(args: argparse.Namespace) -> int:
    from flows.serving.export import export_version
    from storage.io.registry import ModelRegistry

    layout = _load(args).layout()
    version = ModelRegistry(layout).resolve(args.model)
    manifest = export_version(layout, version, args.out, delta_from=args.delta_from, dtype=args.dtype, onnx=args.onnx)
    keys = ("version", "kind", "base_version", "rows", "table_rows", "evicted", "dtype", "bytes_total",
            "registry_version_bytes", "dtype_auc")
    print(json.dumps({k: manifest.get(k) for k in keys} | {"out": args.out}, default=str))
    return ExitCode.OK


def cmd_score_server(args: argparse.Namespace) -> int:
    import logging

    from flows.serving.reload import BundleSource
    from flows.serving.server import ServeConfig, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = ServeConfig(host=args.host, port=args.port, reload_every_s=args.reload_every,
                         max_body_bytes=args.max_body_bytes, max_lines=args.max_lines,
                         max_batch_rows=args.max_batch_rows, max_wait_ms=args.max_wait_ms,
                         auth_token_env=args.auth_token_env)
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
    from flows.deploy import REPO, deploy_all, ensure_process_pool
    from flows.security import redacted

    if args.pool == "ctr-process":
        ensure_process_pool(args.pool)
    config = cfg.to_dict()
    if redacted(config) != config:
        raise ValueError("config holds credential-like values; put credentials in the environment, not in deployments")
    ids = deploy_all(config, pool=args.pool, cron=args.cron, source=args.source or REPO, alerts=not args.no_alerts)
    for name, dep_id in ids.items():
        print(f"deployed {name}: {dep_id}")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return ExitCode.OK


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _prefect_defaults()
    from flows.deploy import serve_all

    serve_all(cfg.to_dict(), cron=args.cron)
    return ExitCode.OK


def cmd_warm_node(args: argparse.Namespace) -> int:
    from flows.node import warm_node

    report = warm_node(args.spec, args.out, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                       my_addr=args.my_addr, all_addrs=args.all_addrs.split(","), warm=not args.skip_warm,
                       env_file=args.env_file)
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
    from flows.record import Status

    shown = {Status.PUBLISHED: "yes", Status.REFUSED: "REFUSED", Status.CHECK_FAILED: "STOPPED"}
    head = ("date", "ingested", "quarant.", "vocab", "train", "eval", "AUC", "logloss", "published", "version")
    rows = [head] + [(
        r.date, str(r.rows_ingested), str(r.rows_quarantined), str(r.vocab_size), str(r.rows_train),
        str(r.rows_eval), "-" if r.auc is None else f"{r.auc:.4f}", "-" if r.logloss is None else f"{r.logloss:.4f}",
        shown.get(r.status, r.status), str(r.model_version or "-"),
    ) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    refused = [f"  {r.date}: {r.status}: {r.reason}" for r in records if r.status != Status.PUBLISHED]
    return out + ("\n" + "\n".join(refused) if refused else "")


if __name__ == "__main__":
    sys.exit(main())
