"""docs/benchmarks.md's tables, generated from the committed results: `python -m bench._report [--check]`.

Each table sits between `<!-- table: NAME -->` and `<!-- /table -->`, NAME one of `TABLES`; this rewrites what
is between them from `bench/results/<result>.json` (`bench._results`): the rows, then the commit, date and
machine the numbers come from.  `--check` rewrites nothing and exits 1 when a table differs from its result
(tests/bench/test_report.py runs the same check).  After rerunning a benchmark, run this and commit both.  It is
not a benchmark, hence the underscore (tests/bench/test_smoke.py takes every other module of bench/ for one).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._results import transcribed

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RESULTS = REPO / "bench" / "results"
BLOCK = re.compile(r"(<!-- table: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


@dataclass(frozen=True)
class Column:
    path: str
    """Where a row keeps the value: a key, or keys joined by dots (`cpu_s.train`); `_key`: the key of the dict
    the row came from (a `*` in `Table.rows`)."""
    header: str
    fmt: str = ""
    """A format for a number (`{:.4f}`); empty: `cell`'s default."""


@dataclass(frozen=True)
class Table:
    name: str
    result: str
    """The result file, `bench/results/<result>.json`."""
    columns: tuple[Column, ...]
    rows: str = "rows"
    """Where the result keeps its rows: keys joined by dots; a `*` walks every value of a dict or item of a list."""
    where: tuple[tuple[str, Any], ...] = ()
    """(path, value) pairs a row must match to be shown."""
    footer: bool = True
    """Say under the table where its numbers come from; False for a second table of the same result."""


def _c(path: str, header: str, fmt: str = "") -> Column:
    return Column(path, header, fmt)


AUC, DIFF = "{:.4f}", "{:+.4f}"
ONE_LINE = (
    _c("part", "part"),
    _c("req_s", "requests/s", "{:,.0f}"),
    _c("p50_ms", "p50 ms", "{:.2f}"),
    _c("p99_ms", "p99 ms", "{:.2f}"),
    _c("features_ms", "features", "{:.2f}"),
    _c("lookup_ms", "lookup", "{:.2f}"),
    _c("forward_ms", "forward", "{:.2f}"),
    _c("http_other_ms", "HTTP, JSON, loop", "{:.2f}"),
)
"""bench.serve's one-line cells (`--request used --out serve-one-line-<schema>`), one table per schema."""
UNIT = "unit"
"""A column's `fmt` that formats each number by its row's `unit`, as `bench.capacity` prints it."""
TABLES = {
    t.name: t
    for t in (
        Table(
            "bench.ingest",
            "ingest",
            (
                _c("rows", "rows"),
                _c("run", "run"),
                _c("ratio", "vs pyarrow", "{:.2f}x"),
                _c("cpu_s", "CPU s", "{:.1f}"),
                _c("peak_rss_mib", "worker peak MiB", "{:,.0f}"),
            ),
            rows="results",
        ),
        Table(
            "bench.ingest-task",
            "ingest",
            (_c("rows_per_file", "rows in the task's file", "{:,}"), _c("peak_rss_mib", "task peak MiB", "{:,.0f}")),
            rows="task_peaks",
            footer=False,
        ),
        Table(
            "bench.vocab",
            "vocab",
            (
                _c("run", "run"),
                _c("seconds", "wall s", "{:.1f}"),
                _c("cpu_s", "CPU s", "{:.2f}"),
            ),
        ),
        Table("bench.store_index", "store_index", (_c("op", "op"), _c("ratio", "vs pandas get_indexer", "{:.2f}x"))),
        Table(
            "bench.store_host",
            "store_host",
            (
                _c("op", "op"),
                _c("batch", "batch"),
                _c("ratio", "vs index_select"),
                _c("ratio_vs_np_take", "vs np.take"),
            ),
        ),
        Table(
            "bench.store_ssd",
            "store_ssd",
            (
                _c("op", "op"),
                _c("ratio_units_vs_raw", "vs raw O_DIRECT", "{:.2f}x"),
                _c("gc_rows_per_row", "rows moved per row written", "{:.2f}"),
                _c("gc_units_read_per_row", "units read per row written", "{:.2f}"),
            ),
        ),
        Table(
            "bench.store_scale",
            "store_scale",
            (
                _c("row_format", "rows"),
                _c("keys", "keys", "{:.0e}"),
                _c("record_bytes", "record B"),
                _c("rows_per_4k_unit", "rows per 4 KiB"),
                _c("index_bytes_per_key", "index B/key", "{:.1f}"),
                _c("file_GB", "file GB", "{:.1f}"),
                _c("build_s", "build s", "{:,.0f}"),
                _c("reopen_s", "reopen s", "{:,.0f}"),
                _c("ssd_read_us_per_key", "SSD read us/key", "{:,.0f}"),
                _c("host_update_us_per_key", "host update us/key", "{:,.0f}"),
                _c("peak_rss_MB", "peak RSS MB", "{:,.0f}"),
            ),
        ),
        Table(
            "bench.store_upgrade",
            "store_upgrade",
            (
                _c("keys", "keys", "{:,}"),
                _c("path", "path"),
                _c("seconds", "wall s", "{:.1f}"),
                _c("cpu_s", "CPU s", "{:.1f}"),
                _c("s_per_1e8_keys", "s per 10^8 keys", "{:,.0f}"),
                _c("v2_MB", "0.1.0 shard MB", "{:,.0f}"),
                _c("new_MB", "new shard MB", "{:,.0f}"),
            ),
        ),
        Table(
            "bench.store_hitrate",
            "store_hitrate",
            (
                _c("stream", "keys"),
                _c("capacity_%", "capacity %"),
                _c("lfu_hit_per_access", "LFU hits per access", "{:.2f}"),
                _c("lfu_hit", "LFU hits per distinct key", "{:.3f}"),
            ),
        ),
        Table(
            "bench.store_hitrate_bytes",
            "store_hitrate_bytes",
            (
                _c("stream", "keys"),
                _c("budget_%_of_fp32_adam_table", "budget, % of the fp32 Adam rows"),
                _c("row_format", "rows"),
                _c("host_bytes_per_row", "host B/row"),
                _c("lfu_hit_per_access", "LFU hits per access", "{:.3f}"),
            ),
            where=(("budget_%_of_fp32_adam_table", 15),),
        ),
        Table(
            "bench.train",
            "train",
            (
                _c("run", "loop"),
                _c("examples_per_s", "examples/s", "{:,.0f}"),
                _c("vs_plain", "vs plain torch", "{:.3f}x"),
                _c("mfu", "MFU", "{:.3f}"),
            ),
        ),
        Table(
            "bench.dense_step",
            "dense_step",
            (
                _c("run", "one rank's rows: attention"),
                _c("batch", "batch", "{:,}"),
                _c("ms_per_step", "ms/step", "{:.2f}"),
                _c("mfu", "MFU", "{:.3f}"),
                _c("mfu_best", "mfu_best", "{:.3f}"),
            ),
        ),
        Table(
            "bench.kernel_build",
            "kernel_build",
            (
                _c("run", "attention kernel built by"),
                _c("cold_build_s", "cold build s", "{:.1f}"),
                _c("cold_build_cpu_s", "compiler CPU s", "{:.1f}"),
                _c("warm_load_ms", "warm load ms", "{:.1f}"),
                *(_c(f"call_us_b{b}", f"us/call B={b:,}", "{:,.1f}") for b in (1, 128, 1024)),
            ),
        ),
        Table(
            "bench.comm_allreduce",
            "comm_allreduce",
            (_c("size_MB", "MB"), _c("two_phase_vs_flat", "two-phase vs flat")),
        ),
        Table(
            "bench.comm_kstep",
            "comm_kstep",
            (
                _c("k", "k"),
                _c("comm_share", "dense sync share", "{:.2%}"),
                _c("paper_comm_share", "paper's share", "{:.1%}"),
                _c("auc", "AUC", AUC),
            ),
        ),
        Table(
            "bench.het",
            "het",
            (
                _c("procs", "ranks"),
                _c("bound", "staleness bound"),
                _c("bytes_vs_b0", "sparse bytes vs bound 0", "{:.2f}"),
                _c("hit_rate", "hit rate", "{:.2f}"),
            ),
        ),
        Table(
            "bench.quality-later-day",
            "quality-later-day",
            (_c("dataset", "dataset"), _c("model", "model"), _c("auc", "AUC", AUC), _c("auc_sd", "sd over seeds")),
        ),
        Table(
            "bench.quality-synthetic",
            "quality-synthetic",
            (
                _c("dataset", "dataset"),
                _c("model", "model"),
                _c("auc", "later-day AUC", AUC),
                _c("of_ceiling", "of the ceiling", "{:.3f}"),
            ),
        ),
        Table(
            "bench.quality-warm-start",
            "quality-warm-start",
            (
                _c("model", "model"),
                _c("auc", "AUC, its day", AUC),
                _c("next_day_auc", "next-day AUC", AUC),
                _c("later_auc", "LATEST on day 8", AUC),
            ),
        ),
        Table(
            "bench.quality-rolling",
            "quality-rolling",
            (
                _c("dataset", "dataset"),
                _c("model", "model"),
                _c("auc", "pooled AUC", AUC),
                _c("vs_default", "vs default", DIFF),
                _c("vs_sd", "paired sd", "{:.4f}"),
                _c("decided", "decided"),
                _c("train_s", "train s (4 days)", "{:.1f}"),
            ),
        ),
        Table(
            "bench.companion-blend",
            "companion-blend",
            (
                _c("dataset", "dataset"),
                _c("model", "model"),
                _c("vs_default", "AUC vs 0.5", DIFF),
                _c("vs_sd", "sd", "{:.4f}"),
            ),
        ),
        Table(
            "bench.companion_folds",
            "companion_folds",
            (
                _c("dataset", "dataset"),
                _c("cv", "folds"),
                _c("vs_blocks", "AUC vs blocks", DIFF),
                _c("vs_sd", "sd", "{:.4f}"),
                _c("fit_s", "fit s", "{:.0f}"),
            ),
        ),
        Table(
            "bench.companion_solver",
            "companion_solver",
            (
                _c("dataset", "dataset"),
                _c("run", "solver"),
                _c("s", "s", "{:.1f}"),
                _c("loss_excess_ppm", "loss excess, ppm", "{:.2f}"),
            ),
        ),
        Table(
            "bench.quality-ladder",
            "quality-ladder",
            (
                _c("dataset", "dataset"),
                _c("setting", "setting"),
                _c("lr 0.0115", "sparse lr 0.0115", AUC),
                _c("lr 0.023", "0.023", AUC),
                _c("lr 0.046", "0.046", AUC),
            ),
        ),
        Table(
            "bench.rare_positives",
            "rare_positives",
            (
                _c("keep_rate", "keep-rate", "{:g}"),
                _c("auc", "AUC", AUC),
                _c("auc_vs_1", "vs 1", DIFF),
                _c("auc_vs_1_sd", "paired sd", "{:.4f}"),
                _c("logloss", "logloss", "{:.4f}"),
                _c("calibration", "calibration", "{:.2f}"),
                _c("uncorrected", "uncorrected", "{:.2f}"),
                _c("train_s", "train s", "{:.1f}"),
                _c("fit_s", "loop s", "{:.2f}"),
            ),
        ),
        Table(
            "bench.serve",
            "serve",
            (
                _c("part", "part"),
                _c("batch", "lines"),
                _c("clients", "clients"),
                _c("rows_s", "rows/s", "{:,.0f}"),
                _c("p50_ms", "p50 ms", "{:.1f}"),
                _c("p99_ms", "p99 ms", "{:.1f}"),
                _c("mean_ms", "mean ms", "{:.1f}"),
                _c("features_ms", "features", "{:.2f}"),
                _c("lookup_ms", "lookup", "{:.1f}"),
                _c("forward_ms", "forward", "{:.1f}"),
                _c("http_other_ms", "HTTP, JSON, loop", "{:.1f}"),
            ),
        ),
        *(
            Table(f"bench.serve-one-line-{schema}", f"serve-one-line-{schema}", ONE_LINE)
            for schema in ("criteo", "avazu")
        ),
        Table(
            "bench.day",
            "day",
            (
                _c("rows", "rows/day", "{:,}"),
                _c("day", "day"),
                _c("cpu_s.train", "train CPU s", "{:.1f}"),
                _c("train_examples_per_s", "train examples/s", "{:,.0f}"),
                _c("train_mfu", "train MFU", "{:.3f}"),
                _c("auc", "AUC", AUC),
            ),
            rows="runs.*.days.*",
        ),
        Table(
            "bench.bigday",
            "bigday",
            (
                _c("run", "run"),
                _c("warm_rows", "warm rows", "{:,}"),
                _c("examples_per_s", "examples/s", "{:,.0f}"),
                _c("vs_unbounded", "vs unbounded", "{:.2f}x"),
                _c("auc", "AUC", AUC),
                _c("device_hit_rate", "device hit rate", "{:.3f}"),
                _c("host_hit_rate", "host hit rate", "{:.3f}"),
                _c("ssd_read_bytes_per_example", "SSD B read/ex", "{:,.0f}"),
                _c("ssd_write_bytes_per_example", "SSD B written/ex", "{:,.0f}"),
                _c("ssd_wait_share", "SSD wait share", "{:.0%}"),
                _c("evictions_per_example", "evictions/ex", "{:.2f}"),
                _c("rank_peak_rss_mib", "rank peak RSS MiB", "{:,.0f}"),
            ),
            rows="runs",
        ),
        Table(
            "bench.capacity",
            "capacity",
            (
                _c("scenario", "case"),
                _c("what", "what"),
                _c("adam/fp32", "fp32 Adam (before)", UNIT),
                _c("wide_rowwise_adam/int8s/log8", "default (48 B)", UNIT),
                _c("adam/int8/log8", "int8 Adam (64 B)", UNIT),
                _c("rowwise_adagrad/int8", "int8 AdaGrad (36 B)", UNIT),
            ),
        ),
        Table(
            "bench.gpu_probe",
            "gpu_probe",
            (_c("_key", "leg"), _c("examples_per_s", "examples/s", "{:,.0f}"), _c("ms_per_step", "ms/step")),
            rows="throughput.*",
        ),
        Table(
            "bench.gpu_probe-phases",
            "gpu_probe",
            (
                _c("_key", "device"),
                *(_c(k, f"{k.replace('_', ' ')} ms") for k in ("pull", "forward", "backward", "push", "dense_adam")),
            ),
            rows="phases.*",
            footer=False,
        ),
    )
}


def with_unit(v: float, unit: str) -> str:
    """`v` in `unit`, bytes scaled to k/M/G/T (as `bench.capacity` prints its plan)."""
    if unit in ("B", "B/s"):
        for scale, name in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:,.1f} {name}{unit}"
    return f"{v:,.0f} {unit}" if abs(v) >= 100 or unit in ("cores", "GPUs", "nodes") else f"{v:.3g} {unit}"


def cell(value: Any, fmt: str = "", unit: str = "") -> str:
    """A table cell: empty for a missing value, `fmt` for a number (`UNIT`: by `unit`), else a plain rendering."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if fmt == UNIT and isinstance(value, int | float):
        return with_unit(value, unit)
    if fmt and isinstance(value, int | float):
        return fmt.format(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return str(value).replace("|", "\\|")


def _get(obj: Any, path: str) -> Any:
    if isinstance(obj, dict) and path in obj:  # a key with a dot of its own (`lr 0.023`)
        return obj[path]
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def rows_of(result: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The rows at `path` (`Table.rows`), each a dict; a row reached through a dict's `*` gets its key as `_key`."""
    level: list[tuple[Any, Any]] = [(None, result)]
    for part in path.split("."):
        nxt: list[tuple[Any, Any]] = []
        for key, obj in level:
            if part == "*" and isinstance(obj, dict):
                nxt += list(obj.items())
            elif part == "*" and isinstance(obj, list):
                nxt += [(key, x) for x in obj]
            elif isinstance(obj, dict) and part in obj:
                nxt.append((key, obj[part]))
        level = nxt
    return [
        {**row, "_key": key} if key is not None else row
        for key, obj in level
        for row in (obj if isinstance(obj, list) else [obj])
        if isinstance(row, dict)
    ]


def machine_line(result: dict[str, Any]) -> str:
    m = result.get("machine") or {}
    parts = [f"{m['cpus']} CPUs" if m.get("cpus") else "", m.get("cpu_model") or ""]
    parts.append(f"{m['memory_gib']} GiB" if m.get("memory_gib") else "")  # the platform stays in the file
    return ", ".join(p for p in parts if p) or "machine not recorded"


def render(table: Table, result: dict[str, Any]) -> str:
    """The markdown between the table's markers: the rows, then where the numbers come from."""
    rows = [r for r in rows_of(result, table.rows) if all(_get(r, p) == v for p, v in table.where)]
    lines = [
        "| " + " | ".join(c.header for c in table.columns) + " |",
        "|" + "---|" * len(table.columns),
        *(
            "| " + " | ".join(cell(_get(r, c.path), c.fmt, r.get("unit", "")) for c in table.columns) + " |"
            for r in rows
        ),
    ]
    where = f"`bench/results/{table.result}.json`"
    if not table.footer:
        lines.append(f"\nFrom {where}, the run above.")
        return "\n".join(lines) + "\n"
    commit = str(result.get("commit", "unknown"))
    commit = commit[:7] + ("-dirty" if commit.endswith("-dirty") else "")  # measured on a tree no commit holds
    source = "; transcribed" if transcribed(result) else f"; {result['source']}" if result.get("source") else ""
    lines.append(f"\nFrom {where}: {commit}, {result.get('date', 'no date')}, {machine_line(result)}{source}.")
    if result.get("conditions"):
        lines.append(str(result["conditions"]))
    return "\n".join(lines) + "\n"


def load(results: Path, name: str) -> dict[str, Any]:
    path = results / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run its benchmark (docs/benchmarks.md says how)")
    return json.loads(path.read_text())


def rewrite(text: str, results: Path = RESULTS) -> str:
    """`text` (docs/benchmarks.md) with every table regenerated from `results`.

    Raises:
        KeyError: a marker names no table of `TABLES`.
    """

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in TABLES:
            raise KeyError(f"<!-- table: {name} -->: no such table (bench._report.TABLES: {', '.join(TABLES)})")
        table = TABLES[name]
        return m.group(1) + render(table, load(results, table.result)) + m.group(4)

    return BLOCK.sub(sub, text)


def stale(text: str, results: Path = RESULTS) -> list[str]:
    """The names of the tables in `text` that differ from what their results give."""
    fresh = {m.group("name"): m.group(0) for m in BLOCK.finditer(rewrite(text, results))}
    return [m.group("name") for m in BLOCK.finditer(text) if fresh.get(m.group("name")) != m.group(0)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench._report", description=__doc__.splitlines()[0])
    p.add_argument("--doc", type=Path, default=DOC)
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is stale")
    args = p.parse_args(argv)
    text = args.doc.read_text()
    if args.check:
        names = stale(text, args.results)
        if names:
            print(f"stale tables in {args.doc}: {', '.join(names)}: run `python -m bench._report`", file=sys.stderr)
        return 1 if names else 0
    new = rewrite(text, args.results)
    if new != text:
        args.doc.write_text(new)
    print(f"{args.doc}: {len(BLOCK.findall(new))} tables from {args.results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
