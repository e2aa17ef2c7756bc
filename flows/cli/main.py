"""`ctrpipe`: the command line of ctr-pipeline (`ctrpipe --help`, `ctrpipe COMMAND --help`).

    ctrpipe --version
    ctrpipe demo [--root DIR] [--days N]
    ctrpipe generate --out DIR --days N --rows-per-day R [--seed S] [--start-date D] [--interactions N]
                     [--keys N] [--zipf S]
    ctrpipe run --date D [--config FILE] [--preset NAME] [--set KEY=VALUE ...] [--force] [--allow-older]
    ctrpipe backfill --start D --end D [--config FILE] [--preset NAME] [--set ...] [--force]
    ctrpipe evaluate --model latest|VERSION --input URL [--format criteo|avazu|SCHEMA.yaml] [--predictions URL]
                     [--config FILE]
    ctrpipe check-schema [--date D] [--input URL] [--format F] [--lines N] [--config FILE]
    ctrpipe models list|show VERSION|rollback VERSION|prune [--dry-run] [--config FILE] [--set ...]
    ctrpipe export --model latest|VERSION --out URL [--delta-from VERSION] [--dtype float16] [--onnx] [--config FILE]
    ctrpipe score-server [--model latest|VERSION | --bundle URL] [--host H] [--port P] [--reload-every S] [--mmap]
                         [--auth-token-env NAME] [--config FILE]
    ctrpipe deploy [--pool NAME] [--cron CRON] [--config FILE] [--set ...] [--no-alerts]
    ctrpipe serve [--cron CRON] [--config FILE] [--set ...]
    ctrpipe warm-node --spec URL --out FILE --nnodes N --my-addr ADDR --all-addrs A,B,...

This module dispatches the commands; every option and its help is in `flows.cli.parser`, the commands that run
the daily flow (demo, run, backfill) in `flows.cli.run_commands`, `models` in `flows.cli.models_command`.
Errors are one short message (what failed, the file/line/key, what to do: `flows.cli.errors`) and an exit code
from `flows.cli.exit_codes`; `--verbose` or CTRPIPE_TRACEBACK=1 add the traceback and the libraries' logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback

from flows.cli import console
from flows.cli.arguments import at_least_one, load_config_of
from flows.cli.check_schema import cmd_check_schema
from flows.cli.errors import RunFailed, describe
from flows.cli.exit_codes import ExitCode
from flows.cli.models_command import cmd_models
from flows.cli.parser import build_parser
from flows.cli.prefect_env import prefect_defaults
from flows.cli.run_commands import cmd_backfill, cmd_demo, cmd_run


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


# ---- commands --------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    from pipeline.generate import generate_days
    from storage.io.dates import validate_date

    at_least_one(days=args.days, rows_per_day=args.rows_per_day)
    validate_date(args.start_date)
    for day in generate_days(
        args.out,
        args.days,
        args.rows_per_day,
        seed=args.seed,
        start_date=args.start_date,
        interactions=args.interactions,
        keys=args.keys,
        **({"zipf": args.zipf} if args.zipf is not None else {}),
    ):
        print(
            f"{day.date}  {day.rows:>9} rows  click rate {day.click_rate:.3f}  {day.keys:,} keys "
            f"({day.repeated:,} seen twice or more)  {day.path}",
            flush=True,
        )
    return ExitCode.OK


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = load_config_of(args)
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


# ---- serving ---------------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace) -> int:
    from flows.serving.export import export_version
    from storage.io.registry import ModelRegistry

    layout = load_config_of(args).layout()
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
        source = BundleSource(layout=load_config_of(args).layout(), version=args.model, mmap=args.mmap)
    serve(source, config)
    return ExitCode.OK


def cmd_deploy(args: argparse.Namespace) -> int:
    cfg = load_config_of(args)
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
    cfg = load_config_of(args)
    prefect_defaults()
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
    "check-schema": cmd_check_schema,
    "models": cmd_models,
    "warm-node": cmd_warm_node,
    "export": cmd_export,
    "score-server": cmd_score_server,
}


if __name__ == "__main__":
    sys.exit(main())
