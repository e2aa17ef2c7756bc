"""Capacity on paper: what a terabyte day needs to finish in 2 hours, computed from the bench results.

    python -m bench.capacity [--results bench/results] [--gpu-probe probe.json] [--hours 2] [--smoke]

Reads the JSON files the benchmarks wrote (`bench/results/<name>.json`: ingest, vocab, store_ssd,
store_scale, store_hitrate, comm_kstep, train, day) and the GPU check's probe when one has run
(`make gpu-check`, `bench/gpu_probe.py`).  Every input is printed with the measurement it comes
from; an input whose file is absent falls back to the figure docs/benchmarks.md records for the
same benchmark, or to a stated assumption, and says so.  Then, for each scenario (a Criteo-1TB day;
the same day over a Baidu-sized key space), the stage budgets of the day and per stage the cores,
GPUs, DRAM, SSD bytes and IOPS, and network bytes/s it needs, each line naming its inputs, side by
side for three row formats: the fp32 rows with Adam of the releases before compact rows, the
default (`store.row_dtype`, `store.state_dtype`, `optim.sparse_optimizer`), int8 rows with Adam's moments in
log8, and int8 rows with row-wise AdaGrad (`FORMATS`; a format listed twice appears once).
docs/capacity.md explains the model; the numbers also go to bench/results/capacity.json, whose main lines
docs/benchmarks.md shows.  `--smoke` is the same run (it takes seconds at any size).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import add_smoke, results_dir, write_json
from bench._results import transcribed
from storage.embedding.config import StoreConfig
from storage.embedding.host import host_row_bytes
from storage.embedding.rows.format import RowFormat
from storage.embedding.ssd.disk_format import RecordLayout
from trainer.config import OptimConfig

FIELDS, DENSE = 26, 13


@dataclass(frozen=True)
class Input:
    value: float
    unit: str
    source: str
    """Which measurement it is, or `assumed: ...` / `docs/benchmarks.md: ...` when its result file is absent."""


@dataclass(frozen=True)
class Scenario:
    name: str
    rows: float
    text_bytes: float
    keys: float
    """Rows of the embedding table (distinct keys kept)."""


SCENARIOS = (
    Scenario("Criteo-1TB day", 195e6, 46e9, 1e9),
    Scenario("Baidu-sized key space", 195e6, 46e9, 1e11),
)
NODE = {"gpus": 8, "cores": 112, "dram_bytes": 2e12, "ssd_bytes": 8 * 3.84e12, "nic_bytes_per_s": 8 * 400e9 / 8}
NODE_SOURCE = (
    "assumed node: NVIDIA DGX H100 datasheet (8 GPUs, 2 x 56 cores, 2 TB DRAM, 8 x 3.84 TB NVMe, 8 x 400 Gb/s)"
)
BUDGET_SHARES = {"ingest": 0.15, "vocab": 0.05, "encode": 0.10, "train": 0.60, "evaluate": 0.05, "other": 0.05}
"""Share of the day's deadline each stage gets (stages run one after another); `other` holds warm,
publish and the flow's overheads.  An assumption: training takes most, as it does at 1M rows here."""
SCALE_OUT_EFFICIENCY = 0.8
"""Assumed share of linear speed-up kept when a data stage spreads over many workers."""
LABELS: dict[RowFormat, str] = {}
for _fmt, _label in (
    (RowFormat(16, "adam", "fp32"), "before"),
    (StoreConfig(embedding_dim=16).row_format(OptimConfig().sparse_optimizer), "default"),
    (RowFormat(16, "adam", "int8", "log8"), "int8 Adam"),
    (RowFormat(16, "rowwise_adagrad", "int8"), "smallest"),
):
    LABELS.setdefault(_fmt, _label)
FORMATS = tuple(LABELS)
"""The columns of every scenario: the rows before compact rows (fp32 + Adam), the default ones, int8 rows with
Adam's moments in log8 (64-byte records), and the smallest with a per-key adaptive step (int8 rows with row-wise
AdaGrad, 36-byte records); a format listed twice keeps its first label."""


def _load(results: Path, name: str) -> dict[str, Any] | None:
    """The result, or None where it is absent or transcribed (it holds only a table's numbers, and the
    fallbacks below are those same figures)."""
    path = results / f"{name}.json"
    result = json.loads(path.read_text()) if path.exists() else None
    return None if result is None or transcribed(result) else result


def _synthetic_bytes_per_row() -> float:
    """Text bytes of a synthetic Criteo row (`pipeline.generate`), to turn the rows of a bench into bytes."""
    import io

    import pyarrow.csv as pacsv

    from pipeline.generate import generate_day

    table, _ = generate_day(0, 20_000, seed=0)
    buf = io.BytesIO()
    pacsv.write_csv(table, buf, pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none"))
    return buf.tell() / 20_000


def load_inputs(results: Path, gpu_probe: Path | None) -> dict[str, Input]:
    """Every input of the model, with its source."""
    out: dict[str, Input] = {}
    ingest = _load(results, "ingest")
    gz = [r for r in (ingest or {}).get("results", []) if r["run"].startswith("project") and "gzip" in r["input"]]
    if gz:
        r = max(gz, key=lambda r: r["rows"])
        out["ingest_bytes_per_cpu_s"] = Input(
            r["MB_per_s_raw"] * 1e6 * r["seconds"] / r["cpu_s"],
            "B/CPU-s",
            f"bench/results/ingest.json: project, {r['rows']:,} rows, {r['input']}",
        )
        out["ingest_bytes_per_s_one_file"] = Input(
            r["MB_per_s_raw"] * 1e6 / max(1, ingest["workers"]),
            "B/s",
            "bench/results/ingest.json: raw MB/s over the workers, per worker",
        )
    else:
        bpr = _synthetic_bytes_per_row()
        out["ingest_bytes_per_cpu_s"] = Input(
            5e6 / 14.5 * bpr,
            "B/CPU-s",
            "docs/benchmarks.md bench.ingest: 5M gzip rows in 14.5 CPU-s, x "
            f"{bpr:.0f} B per synthetic row (ingest.json absent)",
        )
        out["ingest_bytes_per_s_one_file"] = Input(
            out["ingest_bytes_per_cpu_s"].value, "B/s", "= ingest_bytes_per_cpu_s: one task per gzip file, one core"
        )
    vocab = _load(results, "vocab")
    if vocab:
        rows = {r["run"]: r for r in vocab["rows"]}
        n = vocab["params"]["rows_per_day"]
        count = next(r for k, r in rows.items() if k.startswith("count one day"))
        inc = rows["incremental update of the last day"]
        keys = next(r for k, r in rows.items() if k.startswith("chain"))["keys_in_window"]
        out["vocab_cpu_s_per_row"] = Input(count["cpu_s"] / n, "CPU-s/row", "bench/results/vocab.json: count one day")
        out["vocab_cpu_s_per_key"] = Input(
            max(0.0, inc["cpu_s"] - count["cpu_s"]) / keys,
            "CPU-s/key",
            f"bench/results/vocab.json: incremental - count, over {keys:,} keys",
        )
    else:
        out["vocab_cpu_s_per_row"] = Input(
            7.1 / 1.29 / 700e3,
            "CPU-s/row",
            "docs/benchmarks.md bench.vocab: a one-day count = 7.1 / 1.29 CPU-s for 700k rows (vocab.json absent)",
        )
        out["vocab_cpu_s_per_key"] = Input(
            1.76 / 14e6, "CPU-s/key", "docs/benchmarks.md bench.vocab: merge 1.76 CPU-s over 14M keys"
        )
    ssd = _load(results, "store_ssd")
    if ssd:
        p = ssd["params"]
        write = next(r for r in ssd["rows"] if r["op"].startswith("write_rows"))
        read = next(r for r in ssd["rows"] if r["op"].startswith("read_rows"))
        out["space_amplification"] = Input(p["space_amplification"], "x", "bench/results/store_ssd.json")
        out["gc_rows_per_row"] = Input(write["gc_rows_per_row"], "rows", "bench/results/store_ssd.json: write_rows")
        out["gc_units_per_row"] = Input(write["gc_units_read_per_row"], "units", "bench/results/store_ssd.json")
        out["ssd_reads_per_s_measured"] = Input(read["units_per_s"], "IOPS", "bench/results/store_ssd.json: this disk")
    else:
        out["space_amplification"] = Input(1.55, "x", "docs/benchmarks.md: file 1.5-1.6x the live rows")
        out["gc_rows_per_row"] = Input(0.85, "rows", "docs/benchmarks.md bench.store: 0.85 rows moved per written row")
        out["gc_units_per_row"] = Input(0.1, "units", "docs/benchmarks.md bench.store: 0.1 units read per written row")
    for fmt in FORMATS:
        layout = RecordLayout.of(fmt)
        out[f"record_bytes {fmt.name}"] = Input(
            layout.record_bytes, "B", f"storage.embedding.ssd.disk_format: dim 16, {fmt.name} + clock + key"
        )
        out[f"host_row_bytes {fmt.name}"] = Input(
            host_row_bytes(fmt), "B", "storage.embedding.host.host_row_bytes: payload + 64 B bookkeeping"
        )
    out["unit_bytes"] = Input(
        RecordLayout.of(FORMATS[0]).unit_bytes, "B", "storage.embedding.ssd.disk_format: one random read"
    )
    scale = _load(results, "store_scale")
    if scale:
        r = max(scale["rows"], key=lambda r: (r["keys"], r.get("row_format") == FORMATS[1].name))
        out["index_bytes_per_key"] = Input(
            r["index_bytes_per_key"], "B", f"bench/results/store_scale.json: {r['keys']:,} keys"
        )
    else:
        out["index_bytes_per_key"] = Input(12.7, "B", "docs/benchmarks.md bench.store scale: 10^8 keys, 1.21 GB index")
    hit = _load(results, "store_hitrate")
    rows = [r for r in (hit or {}).get("rows", []) if r.get("capacity_%") == 15]
    if rows:
        out["host_hit_rate"] = Input(
            min(r["lfu_hit_per_access"] for r in rows),
            "",
            "bench/results/store_hitrate.json: LFU at 15% capacity, the lower of the samples",
        )
    else:
        out["host_hit_rate"] = Input(0.78, "", "docs/benchmarks.md bench.store hitrate: LFU at 15%, Criteo sample")
    comm = _load(results, "comm_kstep")
    model_ratio = _dense_params() / _dense_params(bench_model=True)
    if comm:
        r = next((r for r in comm["rows"] if r["k"] == 10), comm["rows"][0])
        per_merge = r["sync_MB_per_1k_steps"] * 2**20 * r["k"] / 1000 * model_ratio
        out["dense_bytes_per_merge"] = Input(
            per_merge,
            "B",
            f"bench/results/comm_kstep.json: k={r['k']}, x {model_ratio:.2f} (default model / bench model parameters)",
        )
        out["sparse_bytes_per_example"] = Input(
            r["sparse_MB_per_step"] * 2**20 / comm["params"]["batch_per_rank"],
            "B",
            "bench/results/comm_kstep.json: sparse MB per step / batch",
        )
    else:
        params = _dense_params()
        out["dense_bytes_per_merge"] = Input(
            params * 4 * 3 * 2,
            "B",
            f"computed: {params:,} dense parameters x "
            "(weights + 2 Adam moments) x 4 B x 2 (ring allreduce); comm_kstep.json absent",
        )
        out["sparse_bytes_per_example"] = Input(
            FIELDS * (8 + 2 * 16 * 4),
            "B",
            "computed: per key its id and a row pulled and a gradient pushed (an upper bound); comm_kstep.json absent",
        )
    day = _load(results, "day")
    if day:
        n = max(day["runs"], key=int)
        later = day["runs"][n]["days"][1:]
        rows_day = int(n)
        enc_cpu = sum(d["cpu_s"]["encode"] for d in later) / len(later)
        ev = [d for d in later if d["evaluate"]]
        out["encode_cpu_s_per_row"] = Input(
            enc_cpu / rows_day,
            "CPU-s/row",
            f"bench/results/day.json: encode CPU of the process tree, {rows_day:,} rows/day",
        )
        out["evaluate_rows_per_cpu_s"] = Input(
            sum(d["evaluate"]["rows_scored"] for d in ev) / sum(max(d["cpu_s"]["evaluate"], 1e-9) for d in ev),
            "rows/CPU-s",
            "bench/results/day.json: evaluate rows scored / CPU s",
        )
        out["cpu_rank_examples_per_s"] = Input(
            sum(d["train_examples_per_s"] for d in later) / len(later),
            "ex/s",
            f"bench/results/day.json: one CPU rank, {rows_day:,} rows/day",
        )
    else:
        out["encode_cpu_s_per_row"] = Input(
            out["ingest_bytes_per_cpu_s"].value ** -1 * _synthetic_bytes_per_row(),
            "CPU-s/row",
            "assumed: as ingest per row (day.json absent)",
        )
        out["evaluate_rows_per_cpu_s"] = Input(20_000, "rows/CPU-s", "assumed (day.json absent)")
        out["cpu_rank_examples_per_s"] = Input(11_379, "ex/s", "docs/benchmarks.md bench.train: ours w1, one thread")
    if day:
        peaks = [day["runs"][n]["peak_rss"] for n in day["runs"]]
        out["rank_peak_rss"] = Input(max(p.get("rank", 0) for p in peaks), "B", "bench/results/day.json: rank")
        out["worker_peak_rss"] = Input(
            max(p.get("dask worker", 0) for p in peaks), "B", "bench/results/day.json: Dask worker"
        )
    else:
        out["rank_peak_rss"] = Input(1e9, "B", "assumed: 1 GB per rank above its host tier (day.json absent)")
        out["worker_peak_rss"] = Input(0.64 * 2**30, "B", "docs/benchmarks.md bench.ingest: worker peak 0.64 GiB")
    fill = next((r for r in (ssd or {}).get("rows", []) if r["op"].startswith("fill")), None)
    out["ssd_fill_rows_per_s"] = (
        Input(fill["rows_per_s"], "rows/s", "bench/results/store_ssd.json: fill (sequential)")
        if fill
        else Input(518e3, "rows/s", "docs/benchmarks.md bench.store scale: 10^8 keys built at 518k rows/s")
    )
    out["gpu_examples_per_s"] = _gpu_rate(results, gpu_probe)
    return out


def _dense_params(*, bench_model: bool = False) -> int:
    from trainer.models.config import ModelConfig
    from trainer.models.ctr_model import CTRModel

    if bench_model:
        from bench.comm import MODEL as config
    else:
        config = ModelConfig(dropout=0.0)  # `auto` until a day derives it; dropout has no parameters
    return sum(p.numel() for p in CTRModel(config, num_dense=DENSE, num_fields=FIELDS, dim=16).parameters())


def _gpu_rate(results: Path, gpu_probe: Path | None) -> Input:
    """examples/s of one GPU: the GPU check's probe when one ran, else an assumption with its source."""
    paths = [gpu_probe] if gpu_probe else [Path(p) for p in glob.glob(str(results / "*.json"))]
    for path in paths:
        try:
            probe = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        legs = (probe.get("throughput") or {}) if probe.get("device") == "cuda" and probe.get("cuda_available") else {}
        cuda = {k: v["examples_per_s"] for k, v in legs.items() if k.startswith("cuda") and "examples_per_s" in v}
        if cuda:
            leg = max(cuda, key=cuda.get)
            return Input(cuda[leg], "ex/s", f"{path.name}: GPU check, train_step '{leg}', one rank")
    return Input(
        2.6e6 / 4,
        "ex/s",
        "assumed (no GPU check has run): a quarter of DLRM's 2.6M samples/s on one A100 "
        "(NVIDIA DeepLearningExamples TF2 DLRM, TF32, batch 64k: 4.2B Criteo-1TB samples in 26.75 min), "
        "as our rows come from host memory and SSD, not from GPU memory",
    )


@dataclass(frozen=True)
class Line:
    stage: str
    what: str
    value: float
    unit: str
    how: str


def plan(s: Scenario, i: dict[str, Input], hours: float, fmt: RowFormat) -> list[Line]:
    """The resources of one scenario with rows of `fmt`: each line says how it follows from the inputs."""
    record_bytes = i[f"record_bytes {fmt.name}"].value
    host_bytes = i[f"host_row_bytes {fmt.name}"].value
    deadline = hours * 3600
    budget = {k: v * deadline for k, v in BUDGET_SHARES.items()}
    train_rows, eval_rows = 0.9 * s.rows, 0.1 * s.rows
    lines: list[Line] = []

    def add(stage: str, what: str, value: float, unit: str, how: str) -> float:
        lines.append(Line(stage, what, value, unit, how))
        return value

    def cores(cpu_s: float, seconds: float) -> float:
        return math.ceil(cpu_s / seconds / SCALE_OUT_EFFICIENCY)

    one_file = s.text_bytes / i["ingest_bytes_per_s_one_file"].value
    add(
        "ingest",
        "one gzip file on one core",
        one_file,
        "s",
        "text bytes / ingest_bytes_per_s_one_file (a gzip stream is not split)",
    )
    ingest_cpu = s.text_bytes / i["ingest_bytes_per_cpu_s"].value
    add(
        "ingest",
        "cores, input split into files",
        cores(ingest_cpu, budget["ingest"]),
        "cores",
        f"text bytes / ingest_bytes_per_cpu_s = {ingest_cpu:,.0f} CPU-s, over the ingest budget",
    )
    vocab_cpu = s.rows * i["vocab_cpu_s_per_row"].value + s.keys * i["vocab_cpu_s_per_key"].value
    add(
        "vocab",
        "cores",
        cores(vocab_cpu, budget["vocab"]),
        "cores",
        f"rows x vocab_cpu_s_per_row + keys x vocab_cpu_s_per_key = {vocab_cpu:,.0f} CPU-s",
    )
    enc_cpu = s.rows * i["encode_cpu_s_per_row"].value
    add(
        "encode",
        "cores",
        cores(enc_cpu, budget["encode"]),
        "cores",
        f"rows x encode_cpu_s_per_row = {enc_cpu:,.0f} CPU-s",
    )
    rate = i["gpu_examples_per_s"].value
    gpus = add(
        "train",
        "GPUs",
        math.ceil(train_rows / budget["train"] / rate / SCALE_OUT_EFFICIENCY),
        "GPUs",
        "0.9 rows (encode.eval_fraction 0.1) / train budget / gpu_examples_per_s / scale-out efficiency",
    )
    add(
        "train",
        "or CPU ranks (one core each)",
        math.ceil(train_rows / budget["train"] / i["cpu_rank_examples_per_s"].value / SCALE_OUT_EFFICIENCY),
        "cores",
        "0.9 rows / train budget / cpu_rank_examples_per_s / scale-out efficiency",
    )
    ev_cpu = (2 * eval_rows + 100_000) / i["evaluate_rows_per_cpu_s"].value
    add(
        "evaluate",
        "cores",
        cores(ev_cpu, budget["evaluate"]),
        "cores",
        f"(2 models x 0.1 rows + next_day_rows 100,000) / evaluate_rows_per_cpu_s = {ev_cpu:,.0f} CPU-s",
    )
    ssd_total = s.keys * record_bytes * i["space_amplification"].value
    index_total = s.keys * i["index_bytes_per_key"].value
    host_total = 0.15 * s.keys * host_bytes
    nodes = add(
        "store",
        "nodes",
        max(
            math.ceil(gpus / NODE["gpus"]),
            math.ceil(ssd_total / NODE["ssd_bytes"]),
            math.ceil((index_total + host_total) / NODE["dram_bytes"]),
        ),
        "nodes",
        f"max(GPUs / {NODE['gpus']}, SSD bytes / node SSD, DRAM of index + host tier / node DRAM)",
    )
    ranks = add("train", "ranks", max(gpus, nodes), "ranks", "max(GPUs, nodes): every node's shards need a rank")
    add("store", "SSD bytes per node", ssd_total / nodes, "B", "keys x record_bytes x space_amplification / nodes")
    add("store", "DRAM per node: key index", index_total / nodes, "B", "keys x index_bytes_per_key / nodes")
    add(
        "store",
        "DRAM per node: host tier (15% of rows)",
        host_total / nodes,
        "B",
        "0.15 x keys x host_row_bytes / nodes: the capacity host_hit_rate was measured at",
    )
    workers = max(line.value for line in lines if line.unit == "cores" and line.stage != "train")
    add(
        "store",
        "DRAM per node: processes",
        (i["rank_peak_rss"].value * ranks + i["worker_peak_rss"].value * workers) / nodes,
        "B",
        "(rank_peak_rss x ranks + worker_peak_rss x the most cores a data stage needs) / nodes",
    )
    examples_per_s = train_rows / budget["train"]
    misses = examples_per_s * FIELDS * (1 - i["host_hit_rate"].value) / nodes
    add(
        "store",
        "SSD random reads per node",
        misses,
        "IOPS",
        "examples/s x 26 keys x (1 - host_hit_rate) / nodes: one unit read per row missed",
    )
    write_bps = misses * record_bytes * (1 + i["gc_rows_per_row"].value)
    add(
        "store",
        "SSD writes per node",
        write_bps,
        "B/s",
        "each row read is written back once: misses x record_bytes x (1 + gc_rows_per_row), log appends",
    )
    add(
        "store",
        "SSD reads of reclamation per node",
        misses * i["gc_units_per_row"].value,
        "IOPS",
        "misses x gc_units_per_row",
    )
    add(
        "warm",
        "a cold node restoring its shards",
        s.keys / nodes / i["ssd_fill_rows_per_s"].value,
        "s",
        "keys / nodes / ssd_fill_rows_per_s (a node that trained yesterday keeps its shards: no restore)",
    )
    add(
        "publish",
        "sparse snapshot written per day",
        s.keys * record_bytes,
        "B",
        "keys x record_bytes (weights, optimizer state, clocks, keys; before Parquet's compression): the whole "
        "table, every day",
    )
    remote = (nodes - 1) / nodes
    sparse = examples_per_s / nodes * i["sparse_bytes_per_example"].value * remote
    add(
        "network",
        "sparse pull/push per node",
        sparse,
        "B/s",
        "examples/s / nodes x sparse_bytes_per_example x (nodes - 1) / nodes (keys owned elsewhere)",
    )
    for k in (1, 10, 100):
        merges = examples_per_s / ranks / 1024 / k if nodes > 1 else 0.0  # steps of one rank (batch 1024) / k
        add(
            "network",
            f"dense merges per node, k={k}",
            merges * i["dense_bytes_per_merge"].value,
            "B/s",
            f"rank steps/s / {k} x dense_bytes_per_merge, between nodes only (the node leader's share of the "
            "two-phase allreduce)",
        )
    add("network", "node NIC (assumed node)", NODE["nic_bytes_per_s"], "B/s", NODE_SOURCE)
    return lines


def _fmt(v: float, unit: str) -> str:
    if unit in ("B", "B/s"):
        for scale, name in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= scale:
                return f"{v / scale:,.1f} {name}{unit}"
        return f"{v:,.0f} {unit}"
    if abs(v) >= 100 or unit in ("cores", "GPUs", "nodes"):
        return f"{v:,.0f} {unit}"
    return f"{v:.3g} {unit}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=None, help="default: bench/results or $BENCH_RESULTS_DIR")
    p.add_argument(
        "--gpu-probe", type=Path, default=None, help="the GPU check's probe.json (default: any in --results)"
    )
    p.add_argument("--hours", type=float, default=2.0)
    add_smoke(p)
    args = p.parse_args(argv)
    args.results = args.results or results_dir()
    inputs = load_inputs(args.results, args.gpu_probe)
    plans: list[dict[str, Any]] = []
    present = sorted(Path(f).stem for f in glob.glob(str(args.results / "*.json")))
    print(f"result files in {args.results}: {', '.join(present) or 'none'}\n")
    print("| input | value | source |\n|---|---|---|")
    for name, v in inputs.items():
        print(f"| {name} | {_fmt(v.value, v.unit)} | {v.source} |")
    print(
        f"\nDeadline {args.hours:g} h, stage budgets: "
        + ", ".join(f"{k} {v:.0%}" for k, v in BUDGET_SHARES.items())
        + f"; scale-out efficiency {SCALE_OUT_EFFICIENCY:.0%}"
    )
    for s in SCENARIOS:
        print(f"\n### {s.name}: {s.rows / 1e6:,.0f}M rows, {s.text_bytes / 1e9:,.0f} GB of text, {s.keys:.0e} keys\n")
        heads = " | ".join(f"{f.name} ({LABELS[f]})" for f in FORMATS)
        print(f"| stage | what | {heads} | from |\n|---|---|{'---|' * len(FORMATS)}---|")
        for lines in zip(*(plan(s, inputs, args.hours, f) for f in FORMATS), strict=True):
            a = lines[0]
            cells = " | ".join(_fmt(x.value, x.unit) for x in lines)
            print(f"| {a.stage} | {a.what} | {cells} | {a.how} |")
            plans.append(
                {
                    "scenario": s.name,
                    "stage": a.stage,
                    "what": a.what,
                    "unit": a.unit,
                    "from": a.how,
                    **{f.name: x.value for f, x in zip(FORMATS, lines, strict=True)},
                }
            )
    path = write_json(
        "capacity",
        {
            "benchmark": "capacity",
            "params": {"results": str(args.results), "hours": args.hours},
            "inputs": {k: {"value": v.value, "unit": v.unit, "source": v.source} for k, v in inputs.items()},
            "rows": plans,
        },
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
