"""The `ctrpipe` argument parser: every command, its options, help text and examples.

Apart from the commands (`flows.cli.main`): `--help` is one readable place; building it imports nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from flows.cli.exit_codes import ExitCode, help_text
from storage.io.version import VERSION

DEMO_START = "2026-01-01"
DEMO_ROWS_PER_DAY = 20_000
DATE_HELP = "YYYY-MM-DD"
ENVIRONMENT_HELP = """environment:
  CTRPIPE_TRACEBACK=1     print the traceback of an error as well as its message
  CTRPIPE_LOG_LEVEL=LEVEL debug, info (= --verbose), warning (default) or error: Prefect's, Dask's and the
                          trainer's own log lines
  CTRPIPE_PROGRESS=off    no progress bars (they are drawn only on a terminal anyway)
  PREFECT_API_URL=URL     run against that Prefect server instead of a temporary local one"""


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
    """argparse with our usage exit code: its own 2 would read as "refused" (`flows.cli.exit_codes`)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file of config sections over the preset (docs/config-reference.md lists every key; "
        "infra/prod.example.yaml is a commented example)",
    )
    p.add_argument(
        "--preset",
        default="default",
        metavar="NAME",
        help="base configuration (flows/presets.py): default (production sizes) or demo (a tiny model, "
        "./demo-data); default: %(default)s",
    )
    # the earlier spelling of --preset, still accepted, kept out of --help (docs/user-guide.md says so)
    p.add_argument("--recipe", dest="preset", default=argparse.SUPPRESS, metavar="NAME", help=argparse.SUPPRESS)
    _add_set(p)


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key, value parsed as YAML, e.g. --set optim.k_steps=20 "
        "or --set root=s3://bucket/ctr (repeatable; applied last)",
    )


def _command(sub: Any, name: str, summary: str, description: str, examples: list[str]) -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    return sub.add_parser(
        name, help=summary, description=description, epilog=epilog, formatter_class=_Help, parents=[_common()]
    )


def _common() -> argparse.ArgumentParser:
    """Options every command takes (also accepted before the command)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show Prefect's, Dask's and the trainer's log lines, and tracebacks of errors",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ctrpipe",
        formatter_class=_Help,
        description="Daily CTR model retraining: ingest raw ad logs, build vocabularies, train, evaluate, "
        "publish the model when it is not worse.  Dates are " + DATE_HELP + ".",
        epilog="first steps:\n  ctrpipe demo                       3 synthetic days end to end in ./demo-data\n"
        "  ctrpipe models list --preset demo  the versions the demo published\n"
        "  cp infra/prod.example.yaml prod.yaml; ctrpipe run --date 2026-03-01 --config prod.yaml\n"
        "  ctrpipe COMMAND --help             what a command does, with examples\n\n"
        + help_text()
        + "\n\n"
        + ENVIRONMENT_HELP,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=False,
        help="show Prefect's, Dask's and the trainer's log lines, and tracebacks of errors",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"ctrpipe {VERSION}",
        help="print the release this is (RELEASES and CHANGELOG.md list them) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    _add_demo(sub)
    _add_generate(sub)
    _add_run(sub)
    _add_backfill(sub)
    _add_evaluate(sub)
    _add_check_schema(sub)
    _add_models(sub)
    _add_serving_parsers(sub)
    _add_deploy(sub)
    _add_serve(sub)
    _add_warm_node(sub)
    return parser


def _add_demo(sub: Any) -> None:
    p = _command(
        sub,
        "demo",
        "generate a tiny dataset and run the daily flow for each day",
        "Generate synthetic Criteo-format logs for N days from " + DEMO_START + " under ROOT/raw/ (kept "
        "when they are there), then run the daily flow for each day in order and print each day's "
        "table.  Prefect runs a temporary local server; nothing else is needed.",
        ["ctrpipe demo", "ctrpipe demo --root /tmp/ctr-demo --days 5 --rows-per-day 50000"],
    )
    p.add_argument(
        "--root",
        default="./demo-data",
        metavar="DIR",
        help="folder of the generated logs and every output (default: %(default)s)",
    )
    p.add_argument("--days", type=int, default=3, metavar="N", help="days to generate and run (default: %(default)s)")
    p.add_argument(
        "--rows-per-day",
        type=int,
        default=DEMO_ROWS_PER_DAY,
        metavar="R",
        help="rows of each generated day (default: %(default)s)",
    )
    _add_set(p)


def _add_generate(sub: Any) -> None:
    p = _command(
        sub,
        "generate",
        "write synthetic Criteo-format day files",
        "Write day_YYYY-MM-DD.tsv.gz files of synthetic Criteo logs (label, 13 integer and 26 categorical "
        "fields, missing values, power-law value frequencies, new values day by day, clicks from a "
        "planted model).  The same seed writes the same files.",
        ["ctrpipe generate --out ./raw --days 7 --rows-per-day 100000"],
    )
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the day files into")
    p.add_argument("--days", type=int, required=True, metavar="N", help="number of consecutive days")
    p.add_argument("--rows-per-day", type=int, required=True, metavar="R", help="rows of each day")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument(
        "--start-date", default=DEMO_START, metavar="D", help=f"first day, {DATE_HELP} (default: %(default)s)"
    )
    p.add_argument(
        "--interactions",
        type=int,
        default=0,
        metavar="N",
        help="plant N pairwise field interactions and one three-way term in the click model "
        "(default: %(default)s, the additive model)",
    )
    p.add_argument("--keys", type=int, metavar="N", help="values the fields draw from in all (default: ~0.9M)")
    p.add_argument("--zipf", type=float, metavar="S", help="skew of the large fields (default: 1.25; lower: more keys)")


def _add_run(sub: Any) -> None:
    p = _command(
        sub,
        "run",
        "retrain on one day through the Prefect flow",
        "Retrain on one day of logs: ingest, vocab, encode, warm, train, evaluate, publish.  The model "
        "is published when the gate passes; exit code 2 when it refused the model (LATEST unchanged).  "
        "A completed date is not redone unless --force.  Prints the day's table.",
        [
            "ctrpipe run --date 2026-01-01 --preset demo",
            "ctrpipe run --date 2026-03-01 --config prod.yaml",
            "ctrpipe run --date 2026-03-01 --config prod.yaml --set optim.k_steps=20 --force",
        ],
    )
    p.add_argument("--date", required=True, metavar="D", help=f"the day whose logs to train on, {DATE_HELP}")
    p.add_argument("--force", action="store_true", help="redo the date even if it completed, recomputing every stage")
    p.add_argument(
        "--allow-older",
        action="store_true",
        help="let a model trained on a date older than LATEST's become LATEST (publish.allow_older)",
    )
    _add_config_args(p)


def _add_backfill(sub: Any) -> None:
    p = _command(
        sub,
        "backfill",
        "the daily flow for each date of a range, in order",
        "Run the daily flow for each date from --start to --end (both included) in order: each day "
        "warm-starts from the model before it.  Completed dates are skipped; a failed date stops the "
        "backfill, and rerunning the same command resumes at it.",
        ["ctrpipe backfill --start 2026-03-01 --end 2026-03-07 --config prod.yaml"],
    )
    p.add_argument("--start", required=True, metavar="D", help=f"first date, {DATE_HELP}")
    p.add_argument("--end", required=True, metavar="D", help=f"last date (included), {DATE_HELP}")
    p.add_argument("--force", action="store_true", help="redo completed dates too (no ingest ahead)")
    _add_config_args(p)


def _add_evaluate(sub: Any) -> None:
    p = _command(
        sub,
        "evaluate",
        "score a registry model on a log file; prints JSON",
        "Score a registry model on one raw log file, encoded with the model's own vocabulary.  "
        'Prints one JSON line: {"auc", "logloss", "rows", "rows_quarantined", "model"}.',
        [
            "ctrpipe evaluate --input ./demo-data/raw/day_2026-01-03.tsv.gz --preset demo",
            "ctrpipe evaluate --model v00002 --input s3://logs/2026-03-02.csv --format shop.yaml --config prod.yaml",
        ],
    )
    p.add_argument(
        "--model",
        default="latest",
        metavar="VERSION",
        help="latest (the published model, default) or a version such as v00003",
    )
    p.add_argument(
        "--input", required=True, metavar="URL", help="path or fsspec URL of a raw log file (.gz/.bz2 read as such)"
    )
    p.add_argument(
        "--format",
        default=None,
        metavar="FORMAT",
        help="criteo, avazu or a schema file (.yaml) describing the file; default: the config's input.format",
    )
    p.add_argument(
        "--predictions",
        default=None,
        metavar="URL",
        help="also write line number, label and score of every row here (Parquet)",
    )
    _add_config_args(p)


def _add_check_schema(sub: Any) -> None:
    p = _command(
        sub,
        "check-schema",
        "read an input file's first lines with the schema; per-column stats and problems",
        "Read the first lines of the date's input file (any date's without --date) with input.format, as ingest "
        "reads them, without a run: rows valid, quarantined and dated elsewhere, each column's role, fill, "
        "distinct and common values, and the problems found.  Exit code 1 when the schema does not fit them.",
        [
            "ctrpipe check-schema --config prod.yaml --date 2026-03-01",
            "ctrpipe check-schema --input f.csv --format s.yaml",
        ],
    )
    p.add_argument("--date", metavar="D", help=f"the date whose input to read, {DATE_HELP}; its rows count as valid")
    p.add_argument("--input", metavar="URL", help="read this file instead of input.url's")
    p.add_argument("--format", metavar="FORMAT", help="criteo, avazu or a schema file (default: input.format)")
    p.add_argument("--lines", type=int, default=1000, metavar="N", help="lines to read (default: %(default)s)")
    _add_config_args(p)


def _add_models(sub: Any) -> None:
    p = _command(
        sub,
        "models",
        "list, show, roll back or prune registry versions",
        "The model registry under ROOT/models/NAME/: `list` its versions (* marks LATEST) with status, "
        "date, AUC and bytes; `show` a summary of one version (metrics, gate, lineage, sizes and the shape keys a "
        "next day keeps), everything as JSON with --json; `rollback` "
        "moves LATEST (and the servers' bundle pointer) to an earlier published version, atomically; "
        "`prune` applies the retention of the registry section (also run after each publish).",
        [
            "ctrpipe models list --preset demo",
            "ctrpipe models show latest --config prod.yaml",
            "ctrpipe models rollback previous --config prod.yaml",
            "ctrpipe models prune --dry-run --preset demo",
        ],
    )
    p.add_argument(
        "action", choices=["list", "show", "rollback", "prune"], help="list | show VERSION | rollback VERSION | prune"
    )
    p.add_argument(
        "version",
        nargs="?",
        metavar="VERSION",
        help="v00003, latest, or previous (the published version before LATEST)",
    )
    p.add_argument("--dry-run", action="store_true", help="prune: only say what would be deleted")
    p.add_argument(
        "--json", action="store_true", help="show: everything as JSON (metrics, gate checks, lineage, config)"
    )
    _add_config_args(p)


def _add_deploy(sub: Any) -> None:
    p = _command(
        sub,
        "deploy",
        "register the model's daily / on-demand / backfill deployments on a Prefect server",
        "Register the model's three deployments on the Prefect server at PREFECT_API_URL: `<model>-daily` "
        "(cron, UTC: the day before the scheduled time), `<model>-on-demand` (a date) and `<model>-backfill` "
        "(a range), and its alert automations (see the alerts section).  Rerunning updates them.  Creates "
        "the process work pool if missing; a worker then runs them.",
        [
            "ctrpipe deploy --config prod.yaml      # with PREFECT_API_URL=http://127.0.0.1:4200/api set",
            "ctrpipe deploy --config prod.yaml --pool ctr-k8s --cron '30 1 * * *'",
        ],
    )
    p.add_argument(
        "--pool", default="ctr-process", help="work pool (created as a process pool if missing; default: %(default)s)"
    )
    p.add_argument("--cron", default="0 2 * * *", help="schedule of the daily deployment, UTC (default: %(default)s)")
    p.add_argument(
        "--source", default=None, metavar="DIR", help="code folder the worker runs from (default: this checkout)"
    )
    p.add_argument("--no-alerts", action="store_true", help="create no alert automations (see the alerts section)")
    _add_config_args(p)


def _add_serve(sub: Any) -> None:
    p = _command(
        sub,
        "serve",
        "serve the deployments from this process (no worker needed)",
        "Serve the daily, on-demand and backfill deployments from this process until stopped (Ctrl-C): "
        "the single-process alternative to `deploy` and a worker.  Against PREFECT_API_URL it registers "
        "the alert automations as deploy does; with the temporary local server, none.",
        ["ctrpipe serve --config prod.yaml --cron '0 3 * * *'"],
    )
    p.add_argument("--cron", default="0 2 * * *", help="schedule of the daily deployment, UTC (default: %(default)s)")
    p.add_argument("--no-alerts", action="store_true", help="create no alert automations (see the alerts section)")
    _add_config_args(p)


def _add_warm_node(sub: Any) -> None:
    p = _command(
        sub,
        "warm-node",
        "before torchrun on one node of a multi-node job: fetch the train spec, warm this node's shards",
        "Run once per node before that node's torchrun (infra/slurm/train.sbatch and infra/k8s/train-job.yaml do).  "
        "torchrun's c10d rendezvous numbers nodes by the sorted order of their --local_addr strings, so pass each "
        "node's address here and to torchrun: the node's ranks follow from it.",
        [
            "ctrpipe warm-node --spec s3://ctr/runs/ctr/date=2026-03-01/train-spec.json --out /tmp/spec.json "
            "--nnodes 2 --my-addr 10.0.0.5 --all-addrs 10.0.0.5,10.0.0.6"
        ],
    )
    p.add_argument(
        "--spec", required=True, help="train spec JSON (runs/<model>/date=D/train-spec.json): a path or fsspec URL"
    )
    p.add_argument("--out", required=True, help="local path to copy the spec to (what trainer.main reads)")
    p.add_argument("--nnodes", type=int, required=True, help="nodes in the job; must equal the spec's trainer.nnodes")
    p.add_argument("--nproc-per-node", type=int, default=0, help="check against the spec (0: take the spec's)")
    p.add_argument("--my-addr", required=True, help="this node's --local_addr given to torchrun")
    p.add_argument("--all-addrs", required=True, help="comma-separated --local_addr of every node")
    p.add_argument(
        "--env-file",
        default=None,
        help="write the spec's environment of the ranks (trainer.nccl_env, ...) here, to source before torchrun",
    )
    p.add_argument("--skip-warm", action="store_true", help="only fetch and check the spec")


def _add_serving_parsers(sub: Any) -> None:
    """The serving commands: export, score-server."""
    _add_export(sub)
    _add_score_server(sub)


def _add_export(sub: Any) -> None:
    p = _command(
        sub,
        "export",
        "write the serving bundle of a registry version (full, or a delta)",
        "Write the serving bundle of a registry version: the network as torch.export .pt2 (and ONNX with "
        "--onnx), the embedding rows without optimizer state, the feature spec frozen from the model's "
        "vocabulary and a manifest with checksums.  Publishing writes the bundles of each published "
        "version already (ROOT/bundles/NAME/); this is for another dtype, ONNX or a delta from any base.",
        [
            "ctrpipe export --model latest --out ./bundle --preset demo",
            "ctrpipe export --model v00004 --delta-from v00002 --out s3://b/ctr/d4 --config prod.yaml",
            "ctrpipe export --model latest --out ./bundle16 --dtype float16 --preset demo",
        ],
    )
    p.add_argument("--model", default="latest", metavar="VERSION", help="latest, previous or a version such as v00003")
    p.add_argument("--out", required=True, help="the bundle directory to write: a path or fsspec URL")
    p.add_argument(
        "--delta-from",
        default=None,
        metavar="VERSION",
        help="only the rows changed (by clock) or evicted since VERSION, plus the network",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        default="float32",
        help="row dtype (float16: the AUC change it causes is recorded in the manifest)",
    )
    p.add_argument("--onnx", action="store_true", help="also export dense.onnx (needs the onnx extra)")
    _add_config_args(p)


def _add_score_server(sub: Any) -> None:
    p = _command(
        sub,
        "score-server",
        "serve a bundle over HTTP: POST /v1/score, with hot reload",
        "Serve the published model over HTTP: POST /v1/score with raw log lines or rows, GET /v1/model, "
        "/healthz and /readyz.  Follows ROOT/bundles/NAME/LATEST (polled every --reload-every seconds): a "
        "new version is loaded beside the old one, checked with a smoke score, and switched to "
        "atomically; a bundle that fails is refused and the old one keeps serving.",
        [
            "ctrpipe score-server --preset demo --set root=./demo-data",
            "ctrpipe score-server --bundle ./bundle --port 8080",
            "ctrpipe score-server --config prod.yaml --host 0.0.0.0 --auth-token-env SCORER_TOKEN"
            "   # token in $SCORER_TOKEN",
        ],
    )
    p.add_argument(
        "--model",
        default="latest",
        metavar="VERSION",
        help="latest (follow bundles/<model>/LATEST) or a version (pinned) (default: %(default)s)",
    )
    p.add_argument("--bundle", default=None, metavar="URL", help="serve this bundle directory (pinned; no root needed)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, this machine only)")
    p.add_argument(
        "--port",
        type=int,
        default=8000,
        help="port to bind; 0 picks a free one, and the log line "
        "'score-server on http://HOST:PORT' names it (default: %(default)s)",
    )
    p.add_argument(
        "--reload-every",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="poll period of LATEST (default: %(default)s)",
    )
    p.add_argument("--mmap", action="store_true", help="serve the rows memory-mapped (tables larger than RAM)")
    p.add_argument(
        "--auth-token-env",
        default="",
        metavar="NAME",
        help="require Authorization: Bearer <token>, the token read from this environment variable "
        "(default: none, no auth)",
    )
    p.add_argument(
        "--max-lines", type=int, default=10_000, help="most lines or rows per request (default: %(default)s)"
    )
    p.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest request body (default: %(default)s)")
    p.add_argument(
        "--max-batch-rows",
        type=int,
        default=4096,
        help="rows above which requests stop joining a batch (default: %(default)s)",
    )
    p.add_argument(
        "--max-wait-ms",
        type=float,
        default=0.0,
        help="how long a batch waits for more requests once none is queued (default: %(default)s: score at once)",
    )
    p.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per /v1/score request: client, status, entries, milliseconds, version (default: off)",
    )
    _add_config_args(p)
