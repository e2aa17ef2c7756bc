"""`ctrpipe`: the command line of ctr-pipeline.

    ctrpipe demo [--root DIR] [--days N]
    ctrpipe generate --out DIR --days N --rows-per-day R [--seed S] [--start-date D]
    ctrpipe run --date D [--config FILE] [--recipe NAME] [--set KEY=VALUE ...] [--force]
    ctrpipe backfill --start D --end D [--config FILE] [--recipe NAME] [--set ...] [--force]
    ctrpipe evaluate --model latest|VERSION --input URL [--format criteo|avazu] [--config FILE] [--set ...]
    ctrpipe models list|show VERSION|rollback VERSION [--config FILE] [--set ...]
    ctrpipe deploy [--pool NAME] [--cron CRON] [--config FILE] [--set ...]
    ctrpipe serve [--cron CRON] [--config FILE] [--set ...]
    ctrpipe warm-node --spec URL --out FILE --nnodes N --my-addr ADDR --all-addrs A,B,...
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

DEMO_START = "2026-01-01"
DEMO_ROWS_PER_DAY = 20_000


def _prefect_defaults(root: str | None = None) -> None:
    """Offline-friendly Prefect settings, applied only where the user set nothing (before prefect is imported)."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    if root and "PREFECT_HOME" not in os.environ and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_HOME"] = str(Path(root).resolve() / ".prefect")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file of config sections (see README)")
    p.add_argument("--recipe", default="default", help="base configuration: default or demo")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one key, e.g. --set optim.k_steps=20 (repeatable)")


def _load(args: argparse.Namespace) -> Any:
    from flows.config import load_config
    from flows.recipes import by_name

    return load_config(args.config, args.overrides, base=by_name(args.recipe))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctrpipe", description="Daily CTR model retraining pipeline.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="generate a tiny dataset and run the daily flow for each day")
    p.add_argument("--root", default="./demo-data")
    p.add_argument("--days", type=int, default=3)
    p.add_argument("--rows-per-day", type=int, default=DEMO_ROWS_PER_DAY)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("generate", help="write synthetic Criteo-format day files")
    p.add_argument("--out", required=True)
    p.add_argument("--days", type=int, required=True)
    p.add_argument("--rows-per-day", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-date", default=DEMO_START)

    p = sub.add_parser("run", help="one daily retrain through the Prefect flow")
    p.add_argument("--date", required=True)
    p.add_argument("--force", action="store_true", help="redo the date even if it completed")
    _add_config_args(p)

    p = sub.add_parser("backfill", help="the daily flow for each date in a range, in order")
    p.add_argument("--start", required=True)
    p.add_argument("--end", required=True)
    p.add_argument("--force", action="store_true")
    _add_config_args(p)

    p = sub.add_parser("evaluate", help="score a published model on a log file; prints JSON")
    p.add_argument("--model", default="latest", help="latest or a version such as v00003")
    p.add_argument("--input", required=True, help="path or fsspec URL of a raw log file")
    p.add_argument("--format", choices=["criteo", "avazu"], default=None)
    _add_config_args(p)

    p = sub.add_parser("models", help="list, show or roll back registry versions")
    p.add_argument("action", choices=["list", "show", "rollback"])
    p.add_argument("version", nargs="?")
    _add_config_args(p)

    p = sub.add_parser("deploy", help="register the daily / on-demand / backfill deployments on the Prefect server")
    p.add_argument("--pool", default="ctr-process", help="work pool (created as a process pool if missing)")
    p.add_argument("--cron", default="0 2 * * *", help="schedule of the daily deployment (UTC)")
    p.add_argument("--source", default=None, help="code folder the worker runs from (default: this checkout)")
    _add_config_args(p)

    p = sub.add_parser("serve", help="serve the deployments from this process (no worker needed)")
    p.add_argument("--cron", default="0 2 * * *")
    _add_config_args(p)

    p = sub.add_parser(
        "warm-node", help="before torchrun on one node of a multi-node job: fetch the train spec, warm this node's shards",
        description="Run once per node before that node's torchrun (infra/slurm/train.sbatch and "
        "infra/k8s/train-job.yaml do).  torchrun's c10d rendezvous numbers nodes by the sorted order of their "
        "--local_addr strings, so pass each node's address here and to torchrun: the node's ranks follow from it.",
    )
    p.add_argument("--spec", required=True, help="train spec JSON (runs/date=D/train-spec.json): a path or fsspec URL")
    p.add_argument("--out", required=True, help="local path to copy the spec to (what trainer.main reads)")
    p.add_argument("--nnodes", type=int, required=True, help="nodes in the job; must equal the spec's trainer.nnodes")
    p.add_argument("--nproc-per-node", type=int, default=0, help="check against the spec (0: take the spec's)")
    p.add_argument("--my-addr", required=True, help="this node's --local_addr given to torchrun")
    p.add_argument("--all-addrs", required=True, help="comma-separated --local_addr of every node")
    p.add_argument("--skip-warm", action="store_true", help="only fetch and check the spec")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the message of our errors says what to do; no traceback for users
        if os.environ.get("CTRPIPE_TRACEBACK"):
            raise
        print(f"ctrpipe {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


# ---- commands --------------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace) -> int:
    from pipeline.generate import generate_days

    for day in generate_days(args.out, args.days, args.rows_per_day, seed=args.seed, start_date=args.start_date):
        print(f"{day.date}  {day.rows:>9} rows  click rate {day.click_rate:.3f}  {day.path}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from storage.io.dates import validate_date

    validate_date(args.date)  # fail before Prefect starts
    cfg = _load(args)
    _prefect_defaults()
    from flows.daily import call_daily_retrain, record_of

    state = call_daily_retrain(args.date, config=cfg.to_dict(), force=args.force, return_state=True)
    record = record_of(state, cfg.layout(), args.date)
    if record:
        print(format_table([record]))
    if not state.is_completed():
        print(f"daily-retrain {args.date}: {state.name}: {state.message}", file=sys.stderr)
        return 2 if record and record.status == "refused" else 1
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from storage.io.dates import date_range

    date_range(args.start, args.end)  # fail before Prefect starts
    cfg = _load(args)
    _prefect_defaults()
    from flows.daily import backfill
    from flows.record import read_record

    state = backfill(args.start, args.end, config=cfg.to_dict(), force=args.force, return_state=True)
    layout = cfg.layout()
    records = [r for d in date_range(args.start, args.end) if (r := read_record(layout, d))]
    if records:
        print(format_table(records))
    if not state.is_completed():
        print(f"backfill: {state.message}", file=sys.stderr)
        return 1
    print(json.dumps(state.result(), indent=2))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from flows.config import load_config, with_overrides
    from flows.recipes import demo
    from pipeline.generate import generate_days
    from storage.io.dates import date_range, shift_date

    root = str(Path(args.root).resolve())
    cfg = load_config(None, args.overrides, base=demo(root))
    _prefect_defaults(root)
    raw = Path(cfg.layout().raw())
    end = shift_date(DEMO_START, args.days - 1)
    if not all((raw / f"day_{d}.tsv.gz").exists() for d in date_range(DEMO_START, end)):
        print(f"generating {args.days} days x {args.rows_per_day} rows of synthetic Criteo logs in {raw}")
        generate_days(str(raw), args.days, args.rows_per_day, seed=0, start_date=DEMO_START)
    cfg = with_overrides(cfg, {"input.url": str(raw / "day_{date}.tsv.gz")})

    from flows.daily import call_daily_retrain, record_of

    records = []
    for date in date_range(DEMO_START, end):
        state = call_daily_retrain(date, config=cfg.to_dict(), return_state=True)
        record = record_of(state, cfg.layout(), date)
        if record:
            records.append(record)
            print(format_table([record]), flush=True)
    print("\nAll days:\n" + format_table(records))
    print(f"\nOutputs under {root}: events/ quarantine/ vocab/ features/ runs/ models/{cfg.model_name}/")
    return 0 if len(records) == args.days and all(r.completed for r in records) else 1


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from flows.evaluate_file import evaluate_log

    print(json.dumps(evaluate_log(cfg, args.model, args.input, args.format or cfg.input.format)))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from storage.io.registry import ModelRegistry

    reg = ModelRegistry(_load(args).layout())
    if args.action == "list":
        latest = reg.latest()
        for v in reg.versions():
            info = reg.info(v)
            mark = "*" if v == latest else " "
            auc = info.metrics.get("auc")
            print(f"{mark} {v}  {info.status:<9} {info.metrics.get('date', ''):<10} "
                  f"auc={'-' if auc is None else f'{auc:.4f}'}  {info.reason}")
        return 0
    if not args.version:
        raise ValueError(f"models {args.action} needs a VERSION (see `ctrpipe models list`)")
    if args.action == "show":
        info = reg.info(args.version)
        print(json.dumps({"version": info.version, "status": info.status, "reason": info.reason,
                          "created": info.created, "metrics": info.metrics,
                          "lineage": reg.read_json(args.version, "lineage.json")}, indent=2, default=str))
        return 0
    reg.rollback(args.version)
    print(f"LATEST -> {args.version}")
    return 0


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
    ids = deploy_all(config, pool=args.pool, cron=args.cron, source=args.source or REPO)
    for name, dep_id in ids.items():
        print(f"deployed {name}: {dep_id}")
    print(f"start a worker: prefect worker start --pool {args.pool}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _prefect_defaults()
    from flows.deploy import serve_all

    serve_all(cfg.to_dict(), cron=args.cron)
    return 0


def cmd_warm_node(args: argparse.Namespace) -> int:
    from flows.node import warm_node

    report = warm_node(args.spec, args.out, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                       my_addr=args.my_addr, all_addrs=args.all_addrs.split(","), warm=not args.skip_warm)
    print(json.dumps(report, default=str))
    return 0


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
}


def format_table(records: list[Any]) -> str:
    """The per-day summary users read (`DayRecord`s): rows, vocabulary, metrics, publish outcome."""
    head = ("date", "ingested", "quarant.", "vocab", "train", "eval", "AUC", "logloss", "published", "version")
    rows = [head]
    for r in records:
        rows.append((
            r.date, str(r.rows_ingested), str(r.rows_quarantined), str(r.vocab_size), str(r.rows_train),
            str(r.rows_eval), "-" if r.auc is None else f"{r.auc:.4f}", "-" if r.logloss is None else f"{r.logloss:.4f}",
            {"published": "yes", "refused": "REFUSED"}.get(r.status, r.status), str(r.model_version or "-"),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines)
    refused = [f"  {r.date}: {r.status}: {r.reason}" for r in records if r.status in ("refused", "failed")]
    return out + ("\n" + "\n".join(refused) if refused else "")


if __name__ == "__main__":
    sys.exit(main())
