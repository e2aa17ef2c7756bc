"""Helpers shared by the benchmark scripts: tables on stdout, JSON results, memory readings.

Benchmarks are scripts (`python -m bench.<name>`), never tests; each prints a
table and writes its numbers to `bench/results/<name>.json` (or $BENCH_RESULTS_DIR), stamped with the
commit, machine and date (`bench._results`): committed files, from which `bench._report` generates the
tables of docs/benchmarks.md.  Each also takes `--smoke`: a tiny size
that runs in seconds, which `tests/bench/test_smoke.py` runs so that a benchmark that breaks fails CI.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RESULTS_ENV = "BENCH_RESULTS_DIR"
"""Environment variable naming another folder for the results (the smoke test's temporary one)."""
SMOKE_HELP = "a tiny size that runs in seconds: checks the benchmark works, its numbers mean nothing"


def results_dir() -> Path:
    """Where results go: $BENCH_RESULTS_DIR when set, else bench/results."""
    return Path(os.environ.get(RESULTS_ENV) or RESULTS)


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """The `--smoke` flag every `python -m bench.<name>` has (tests/bench/test_smoke.py runs each with it)."""
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)


def apply_smoke(args: argparse.Namespace, smoke: dict[str, Any]) -> argparse.Namespace:
    """`args` with the benchmark's smoke sizes put in when `--smoke` was given (they replace any others)."""
    if args.smoke:
        for key, value in smoke.items():
            setattr(args, key, value)
    return args


def row_format_overrides(name: str) -> dict[str, str]:
    """The config keys (`--set` values) that give the rows called `name`, `optimizer/row_dtype[/state_dtype]`
    (`storage.embedding.rows.format.RowFormat.parse`'s names): the benchmarks' `--row-formats`."""
    from storage.embedding.rows.format import RowFormat

    fmt = RowFormat.parse(16, name)  # checks the name; the dim plays no part in the keys
    return {
        "optim.sparse_optimizer": fmt.optimizer,
        "store.row_dtype": fmt.row_dtype,
        "store.state_dtype": fmt.state_dtype,
    }


@dataclass(frozen=True)
class Variant:
    """A run of the default architecture with some config keys set: `bench.quality`'s `--row-formats` and
    `--variants`, each compared with the default like any model."""

    label: str
    """The model's name in the tables: `attention [<label>]`."""
    sets: dict[str, Any]
    """The config values the variant adds to the product's config."""

    @property
    def folder(self) -> str:
        """A folder name for its runs."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", self.label)

    @staticmethod
    def row_format(name: str) -> Variant:
        """The default with the rows called `name` (`row_format_overrides`)."""
        return Variant(name, row_format_overrides(name))

    @staticmethod
    def parse(text: str) -> Variant:
        """`key=value[,key=value...]`, e.g. `vocab.min_count=1,optim.epochs=2` (values parsed as YAML, as
        `ctrpipe --set` parses them): the label is the text itself.

        Raises:
            ValueError: an item is not `key=value`.
        """
        from flows.config import parse_yaml

        sets = {}
        for item in text.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise ValueError(
                    f"a variant is key=value[,key=value...], e.g. vocab.min_count=1; got {item!r} in {text!r}"
                )
            sets[key.strip()] = parse_yaml(value.strip())  # as `ctrpipe --set` reads it
        return Variant(text, sets)


def environment() -> dict[str, Any]:
    """The commit, date and machine to store beside the numbers, with the library versions (`bench._results`)."""
    from bench._results import stamp

    return stamp()


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write `payload`, stamped with the commit, machine and date, to <results_dir()>/<name>.json and return the
    path: the small file docs/benchmarks.md's tables are generated from (`bench._results.write_result`)."""
    from bench._results import write_result

    return write_result(results_dir(), name, payload)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    """Print dict rows as an aligned text table (floats with 3 significant decimals)."""
    if not rows:
        return
    columns = list(columns or rows[0].keys())

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


def proc_memory() -> dict[str, int]:
    """This process's resident memory now and its peak (VmRSS / VmHWM from /proc, in bytes)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out["rss" if key == "VmRSS" else "peak_rss"] = int(value.split()[0]) * 1024
    return out


def reset_peak_rss() -> None:
    """Reset this process's VmHWM (Linux: write 5 to /proc/self/clear_refs); harmless where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class WorkerMemory:
    """Peak resident memory per Dask worker: VmHWM read at the end plus RSS sampled while running.

    Usage::

        with WorkerMemory(client) as mem:
            run()
        mem.peak_bytes  # {worker address: bytes}
    """

    def __init__(self, client, interval_s: float = 0.25) -> None:
        self.client = client
        self.interval_s = interval_s
        self.peak_bytes: dict[str, int] = {}
        self.sampled_bytes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> WorkerMemory:
        self.client.run(reset_peak_rss)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for addr, m in self.client.run(proc_memory).items():
            self.peak_bytes[addr] = max(m.get("peak_rss", 0), self.sampled_bytes.get(addr, 0))

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for addr, m in self.client.run(proc_memory).items():
                    self.sampled_bytes[addr] = max(self.sampled_bytes.get(addr, 0), m["rss"])
            except Exception:  # noqa: S112 - a sample lost while workers are busy is not an error
                continue


def run_child(code: str, *args: str) -> tuple[float, str]:
    """Run `python -c code args...` in a fresh process; return (wall seconds, its stdout).

    The child should print its own numbers (e.g. `proc_memory()["peak_rss"]`).
    """
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, done.stdout


def mib(n: float) -> float:
    return n / 2**20


# ---- result reports (print a table, write JSON with the environment) ----


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb(pid: int | None = None) -> float:
    """Current resident memory of a process from /proc (no psutil needed)."""
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def timer() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["s"] = time.perf_counter() - t0


def report(
    name: str,
    rows: Sequence[dict[str, Any]],
    *,
    params: dict[str, Any],
    notes: str = "",
    columns: Sequence[str] | None = None,
) -> Path:
    """Print the table (and notes) and write `bench/results/<name>.json` with params and the environment."""
    print(f"\n== {name} ==")
    print_table(rows, columns)
    if notes:
        print(notes)
    path = write_json(name, {"benchmark": name, "params": params, "rows": list(rows), "notes": notes})
    print(f"results: {path}")
    return path


def train_spec(
    features: Path | str, output: Path | str, local_dir: Path | str, *, store: Any, model: Any, run_tag: str, **kw: Any
) -> Any:
    """A one-node train spec for a bench run: `kw` are `trainer.*`, `optim.*` and `het.*` keys by name; the
    `optim` values left `auto` are derived for the features' train rows (`trainer.plan.recipe`), as a daily run does."""
    import dataclasses

    from storage.features_manifest import read_features_manifest
    from storage.io import fsio
    from trainer.config import HetConfig, OptimConfig, TrainerConfig
    from trainer.launch.spec import TrainSpec
    from trainer.plan.recipe import derive

    sections = {"optim": OptimConfig, "het": HetConfig, "trainer": TrainerConfig}
    names = {s: {f.name for f in dataclasses.fields(c)} for s, c in sections.items()}
    unknown = set(kw) - set().union(*names.values())
    if unknown:
        raise ValueError(f"unknown training keys {sorted(unknown)}")
    built = {s: c(**{k: v for k, v in kw.items() if k in names[s]}) for s, c in sections.items()}
    fs, path = fsio.get_fs(str(features))
    if (manifest := read_features_manifest(fs, path)) is None:
        raise FileNotFoundError(f"{features} is not a committed features directory (no {fsio.SUCCESS})")
    rows = manifest.rows_train
    recipe = derive(built["optim"], model, rows=rows, world_size=built["trainer"].world_size)
    built["optim"] = recipe.optim
    return TrainSpec(
        features_url=str(features),
        output_url=str(output),
        init_model_url=None,
        local_dir=str(local_dir),
        model_name="ctr",
        storage_options=None,
        store=store,
        model=recipe.model,
        run_tag=run_tag,
        vocab_date=None,
        **built,
    )
