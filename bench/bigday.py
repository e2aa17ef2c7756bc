"""Days bigger than the host tier: the same generated days trained twice, rows mostly on SSD vs all in memory.

    python -m bench.bigday [--rows 300000] [--keys 10000000] [--zipf 1.0] [--budget-mb 1] [--days 2] [--smoke]
    python -m bench.bigday --rows 1800000 --keys 60000000 --zipf 0.6 --budget-mb 64 --unbounded-mb 4096 \
        --device-cache-rows 200000 --set vocab.min_count=1   # the committed run: 10^7 keys a day

Through the product path: `ctrpipe generate --keys K --zipf S` writes `--days` days, then `ctrpipe backfill` trains
them twice, in fresh roots with the default config (and `--set`s), once with `store.host_budget_mb` = `--budget-mb`
(the bounded root) and once with `--unbounded-mb` (default: the default budget, about 10^7 rows; every row must fit,
and the summary says when that root evicted); `--device-cache-rows` N adds a third root, the bounded one with a
device cache of N rows over its host tier.  Each day after the first warm-starts from the one before, in the bounded
root from rows that lie mostly on SSD; the speed pair is the last day's.  From each day's record: examples/s, AUC,
and the store's rates (`storage.embedding.pressure`: device and host hit rates, SSD bytes read and written per
example, the share of training the step waited on the SSD, evictions per example); from the process tree, the rank's
peak RSS beside its budget.
The disk's own limit is measured in the same run: random 4 KiB O_DIRECT reads per second at the SSD tier's queue
depth (`SsdStore`'s `io_threads`, one `preadv` per unit from each thread), on a file in the same folder.
`ssd_bound_examples_per_s` = that rate x 4 KiB / the bounded day's SSD bytes read per example: what the disk alone
would allow, were every read waited on.

Goal (issue 54): the bounded day's examples/s >= 0.8x the unbounded one's, the same AUC.
Results: bench/results/bigday.json.  `--smoke`: one 3,000-row day per root (half a minute: checks it runs).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench._common import add_smoke, apply_smoke, print_table, write_json
from bench._proctree import ProcessTree
from flows.config import RunConfig
from flows.day.record import read_record
from storage.embedding.ssd.direct_io import UnitFile
from storage.embedding.ssd.store import SsdStore
from storage.io.dates import shift_date

REPO = Path(__file__).resolve().parents[1]
DATE = "2026-01-01"
UNIT = 4096
QUEUE_DEPTH: int = inspect.signature(SsdStore).parameters["io_threads"].default
"""The SSD tier's I/O threads: how many reads it has in flight at once."""
GOAL_RATIO = 0.8
SMOKE = {"rows": 3_000, "days": 1, "keys": 2_000_000, "disk_mb": 16, "disk_s": 0.5}


def ctrpipe(args: list[str], work: Path, log: Path) -> tuple[int, dict[str, int]]:
    """`ctrpipe ARGS` in a fresh process, its output to `log`: the exit code and the tree's peak RSS by kind."""
    env = {
        **os.environ,
        "PREFECT_HOME": os.environ.get("PREFECT_HOME") or str(work / "prefect"),
        "TMPDIR": str(work),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli.main", *args], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
        with ProcessTree(proc.pid) as tree:
            rc = proc.wait()
    return rc, tree.peak_rss_by_kind()


def generate(work: Path, rows: int, keys: int, zipf: float, days: int = 1) -> dict[str, Any]:
    """The days, through `ctrpipe generate`: the first day's distinct keys and the ones seen twice (what the vocab
    admits)."""
    log = work / "generate.log"
    args = ["generate", "--out", str(work / "raw"), "--days", str(days), "--rows-per-day", str(rows)]
    args += ["--start-date", DATE]
    rc, _ = ctrpipe([*args, "--keys", str(keys), "--zipf", str(zipf)], work, log)
    text = log.read_text()
    found = re.search(r"([\d,]+) keys \(([\d,]+) seen twice", text)
    if rc or not found:
        raise RuntimeError(f"ctrpipe generate exited {rc}:\n{text[-2000:]}")
    return {"rows": rows, "keys": int(found[1].replace(",", "")), "repeated": int(found[2].replace(",", ""))}


def train_days(
    work: Path, tag: str, budget_mb: int | None, days: int, device_rows: int = 0, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """`ctrpipe backfill` of the `days` days in a root of its own (`budget_mb` None: the default budget;
    `device_rows` > 0: a device cache of that many rows over the host tier, a CPU cache on a CPU rank); a row per
    day.  Each day after the first warm-starts from the model before it: with a small budget, from rows that lie
    mostly on the SSD tier.  `extra`: more `KEY=VALUE` settings, for every root."""
    root = work / f"root-{tag}"
    sets = {
        "root": str(root),
        "input.url": f"{work / 'raw'}/day_{{date}}.tsv.gz",
        **dict(kv.split("=", 1) for kv in extra),
    }
    if budget_mb is not None:
        sets["store.host_budget_mb"] = str(budget_mb)
    if device_rows:
        sets["store.device_cache_rows"] = str(device_rows)
    dates = [shift_date(DATE, i) for i in range(days)]
    t0 = time.perf_counter()
    rc, peaks = ctrpipe(
        [
            "backfill",
            "--start",
            dates[0],
            "--end",
            dates[-1],
            *(a for k, v in sets.items() for a in ("--set", f"{k}={v}")),
        ],
        work,
        work / f"{tag}.log",
    )
    wall = time.perf_counter() - t0
    budget = budget_mb if budget_mb is not None else RunConfig().store.host_budget_mb
    rows = []
    for i, date in enumerate(dates):
        record = read_record(RunConfig(root=str(root)).layout(), date)
        if rc not in (0, 2) or record is None or not record.completed:  # 2: the gate refused, the day still trained
            raise RuntimeError(f"ctrpipe backfill ({tag}) exited {rc}:\n{(work / f'{tag}.log').read_text()[-3000:]}")
        store = record.train.get("store") or {}
        rows.append(
            {
                "run": f"{tag} ({budget} MiB host), day {i + 1}" + (" (cold)" if i == 0 else " (warm)"),
                "budget_mib": budget,
                "day": i + 1,
                "warm_rows": (record.warm or {}).get("rows"),
                "examples": record.train.get("examples"),
                "examples_per_s": record.train.get("examples_per_s"),
                "train_s": record.seconds.get("train"),
                "warm_s": record.seconds.get("warm"),
                "backfill_wall_s": wall,
                "auc": record.auc,
                **{k: store.get(k) for k in _STORE_KEYS},
                "rank_peak_rss_mib": peaks.get("rank", 0) / 2**20,
            }
        )
    return rows


_STORE_KEYS = (
    "host_hit_rate",
    "device_hit_rate",
    "ssd_read_bytes_per_example",
    "ssd_write_bytes_per_example",
    "ssd_wait_s",
    "ssd_wait_share",
    "evictions_per_example",
    "host_rows",
    "ssd_rows",
)


def disk_random_reads(folder: Path, size_mb: int, seconds: float, depth: int = QUEUE_DEPTH) -> dict[str, Any]:
    """Random 4 KiB reads per second on a `size_mb` file in `folder` at queue depth `depth` (one unit per `preadv`
    from each of `depth` threads, O_DIRECT where the filesystem allows it), for about `seconds`."""
    path = Path(tempfile.mkdtemp(dir=folder)) / "disk-probe"
    units = size_mb * 2**20 // UNIT
    f = UnitFile(path, UNIT, io_threads=depth)
    try:
        chunk = 2048
        buf = f.buffer(chunk)
        buf.write(os.urandom(chunk * UNIT))
        for lo in range(0, units, chunk):
            f.write(np.arange(lo, min(units, lo + chunk)), buf)
        f.fsync()
        rng, batch, done, t0 = np.random.default_rng(0), 64 * depth, 0, time.perf_counter()
        read_buf = f.buffer(batch)
        while time.perf_counter() - t0 < seconds:
            # sorted, spaced units: no two adjacent, so every unit is a read of its own
            picks = np.sort(rng.choice(units // 2, batch, replace=False)) * 2
            f.read(picks, read_buf)
            done += batch
        elapsed = time.perf_counter() - t0
        return {
            "reads_per_s": done / elapsed,
            "MB_per_s": done * UNIT / elapsed / 1e6,
            "queue_depth": depth,
            "file_mb": size_mb,
            "direct_io": f.direct_io_active,
        }
    finally:
        f.close()
        path.unlink(missing_ok=True)
        path.parent.rmdir()


def compare(
    bounded: dict[str, Any], unbounded: dict[str, Any], disk: dict[str, Any], day: dict[str, Any]
) -> dict[str, Any]:
    """The bounded day against the unbounded one and the disk: the numbers the table and the goal read."""
    per_ex = bounded.get("ssd_read_bytes_per_example") or 0.0
    train_s = bounded.get("train_s") or 0.0
    reads = per_ex * (bounded.get("examples") or 0) / UNIT
    return {
        "vs_unbounded": bounded["examples_per_s"] / unbounded["examples_per_s"],
        "auc_diff": (bounded["auc"] or 0.0) - (unbounded["auc"] or 0.0),
        "ssd_reads_per_s_of_training": reads / train_s if train_s else 0.0,
        "disk_share": reads / train_s / disk["reads_per_s"] if train_s else 0.0,
        "ssd_bound_examples_per_s": disk["reads_per_s"] * UNIT / per_ex if per_ex else None,
        "host_fit_share": min(1.0, (bounded.get("host_rows") or 0) / max(1, day["repeated"])),
        "goal_met": bounded["examples_per_s"] >= GOAL_RATIO * unbounded["examples_per_s"],
        # a reference that evicted is no all-in-memory day: raise --unbounded-mb
        "unbounded_evicted": (unbounded.get("evictions_per_example") or 0) > 0,
    }


def _ratio(pair: tuple[dict[str, Any], dict[str, Any]]) -> float:
    return float(pair[0]["vs_unbounded"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=300_000, help="rows of the day")
    p.add_argument("--keys", type=int, default=10_000_000, help="`ctrpipe generate --keys`")
    p.add_argument("--zipf", type=float, default=1.0, help="`ctrpipe generate --zipf` (the large fields' skew)")
    p.add_argument("--budget-mb", type=int, default=1, help="store.host_budget_mb of the bounded day")
    p.add_argument(
        "--unbounded-mb",
        type=int,
        default=None,
        help="store.host_budget_mb of the unbounded day (default: the default config's); every row must fit",
    )
    p.add_argument("--disk-mb", type=int, default=512, help="size of the disk probe's file")
    p.add_argument("--disk-s", type=float, default=5.0, help="seconds of random reads in the disk probe")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config for both roots (--set)")
    p.add_argument("--days", type=int, default=2, help="days per root; the speed pair is the last (warm) day's")
    p.add_argument("--repeat", type=int, default=1, help="bounded/unbounded pairs, alternated (the machine's load)")
    p.add_argument("--device-cache-rows", type=int, default=0, help="> 0: one more bounded root with all three tiers")
    p.add_argument("--work", default=None, help="folder for the day's files and roots (default: a temp dir)")
    add_smoke(p)
    args = apply_smoke(p.parse_args(argv), SMOKE)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-bigday-"))
    work.mkdir(parents=True, exist_ok=True)
    day = generate(work, args.rows, args.keys, args.zipf, args.days)
    print(f"day 1: {day['rows']:,} rows, {day['keys']:,} keys, {day['repeated']:,} seen twice or more", flush=True)
    rows: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []  # the last day of each root: what the pairs compare
    for i in range(1, args.repeat + 1):  # each pair back to back: a load that changes meanwhile hits both
        tag = f"-{i}" if args.repeat > 1 else ""
        bounded = train_days(work, f"bounded{tag}", args.budget_mb, args.days, extra=tuple(args.set))
        unbounded = train_days(work, f"unbounded{tag}", args.unbounded_mb, args.days, extra=tuple(args.set))
        for b, u in zip(bounded, unbounded, strict=True):
            b["vs_unbounded"], u["vs_unbounded"] = b["examples_per_s"] / u["examples_per_s"], 1.0
        rows += [*bounded, *unbounded]
        last += [bounded[-1], unbounded[-1]]
    if args.device_cache_rows:
        three = train_days(work, "three-tiers", args.budget_mb, args.days, args.device_cache_rows, tuple(args.set))
        for t, u in zip(three, rows[-args.days :], strict=True):
            t["vs_unbounded"] = t["examples_per_s"] / u["examples_per_s"]
        rows += three
    disk = disk_random_reads(work, args.disk_mb, args.disk_s)
    pairs = sorted(zip(last[::2], last[1::2], strict=True), key=_ratio)
    bounded, unbounded = pairs[len(pairs) // 2]  # the median pair
    summary = compare(bounded, unbounded, disk, day)
    print_table(
        rows,
        [
            "run",
            "warm_rows",
            "examples_per_s",
            "vs_unbounded",
            "auc",
            "device_hit_rate",
            "host_hit_rate",
            "ssd_read_bytes_per_example",
            "ssd_write_bytes_per_example",
            "ssd_wait_share",
            "evictions_per_example",
            "rank_peak_rss_mib",
        ],
    )
    print(
        f"disk: {disk['reads_per_s']:,.0f} random 4 KiB reads/s at queue depth {disk['queue_depth']} "
        f"(O_DIRECT: {disk['direct_io']}); {summary}"
    )
    conditions = (
        f"Disk: {disk['reads_per_s']:,.0f} random 4 KiB O_DIRECT reads/s at queue depth {disk['queue_depth']}, "
        f"{summary['disk_share']:.0%} used; the median of {len(pairs)} pairs (all in `runs`)."
    )
    write_json(
        "bigday",
        {
            "day": day,
            "rows": [bounded, unbounded],  # the median pair of last days; every day of every root in `runs`
            "runs": rows,
            "disk": disk,
            "summary": summary,
            "goal_ratio": GOAL_RATIO,
            "conditions": conditions,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
