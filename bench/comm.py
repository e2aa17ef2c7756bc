"""Dense communication on 2 "nodes" x 2 processes (gloo, one machine): two-phase vs flat allreduce, and k-step Adam.

    python -m bench.comm [--sizes-mb 1,4,16,64] [--ks 1,10,50,100,200] [--steps 400] [--rate 1gbit] [--smoke]

1. Allreduce of a float32 buffer of 1-64 MB, flat (`flat_all_reduce`, one
   ring over the 4 ranks) vs two-phase (`hierarchical_all_reduce`: reduce inside
   each node, allreduce between the 2 leaders, broadcast back).
2. k-step Adam: the trainer on synthetic Criteo-shaped data for k = 1, 10, 50,
   100, 200: dense-sync bytes and seconds per 1,000 steps, the share of the
   training loop spent in dense sync, and AUC on the same eval rows.  The
   paper (Baidu, arXiv 2201.05500) reports the communication share falling from
   18.1% (k=10) to 1.2% (k=200) with AUC unchanged.

When run as root with iproute2, each "node" runs in its own network namespace
(`ctrb0`, `ctrb1`), joined by a veth pair shaped with `tc` (`--rate`, `--delay`):
traffic inside a node stays on the kernel's local path, traffic between the
nodes crosses the slow link.  Otherwise both nodes share loopback and the
report says why the namespaces were skipped.

`--smoke`: a 1 MB allreduce once and k = 2 for 4 steps of 64 rows on loopback (seconds; checks it runs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import add_smoke, apply_smoke, report, train_spec
from trainer.models.config import ModelConfig

NS = ("ctrb0", "ctrb1")
IFACES = ("ctrbv0", "ctrbv1")
ADDRS = ("10.231.0.1", "10.231.0.2")
PAPER = {10: "18.1%", 200: "1.2%"}
MODEL = ModelConfig(num_heads=2, attention_layers=1, mlp_dims=(128, 64), dropout=0.0)
"""The small attention model the k-step and HET runs train (they measure communication, not the dense
network; `bench.capacity` scales its dense bytes to the default model's)."""
SHAPER: dict[str, str] = {"kind": ""}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- network namespaces


def setup_netns(rate: str, delay: str) -> str | None:
    """Create the two namespaces and the shaped veth pair; returns None, or why it was skipped."""
    if os.geteuid() != 0:
        return "not root"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) not installed"
    teardown_netns()
    cmds = [
        *(["ip", "netns", "add", ns] for ns in NS),
        ["ip", "link", "add", IFACES[0], "type", "veth", "peer", "name", IFACES[1]],
    ]
    for i in (0, 1):
        cmds += [
            ["ip", "link", "set", IFACES[i], "netns", NS[i]],
            ["ip", "netns", "exec", NS[i], "ip", "addr", "add", f"{ADDRS[i]}/24", "dev", IFACES[i]],
            ["ip", "netns", "exec", NS[i], "ip", "link", "set", IFACES[i], "up"],
            ["ip", "netns", "exec", NS[i], "ip", "link", "set", "lo", "up"],
        ]
    for c in cmds:
        done = subprocess.run(c, capture_output=True, text=True)
        if done.returncode:
            teardown_netns()
            return f"`{' '.join(c)}` failed: {done.stderr.strip()}"
    for i in (0, 1):  # netem (rate + delay) where the kernel has it, else tbf (rate only)
        tc = ["ip", "netns", "exec", NS[i], "tc", "qdisc", "add", "dev", IFACES[i], "root"]
        netem = subprocess.run([*tc, "netem", "delay", delay, "rate", rate], capture_output=True, text=True)
        if netem.returncode:
            tbf = subprocess.run(
                [*tc, "tbf", "rate", rate, "burst", "512kb", "latency", "50ms"], capture_output=True, text=True
            )
            if tbf.returncode:
                teardown_netns()
                return f"tc netem and tbf both failed: {netem.stderr.strip()} / {tbf.stderr.strip()}"
            SHAPER["kind"] = f"tbf rate {rate} (no netem in this kernel: delay not applied)"
        else:
            SHAPER["kind"] = f"netem rate {rate} delay {delay}"
    return None


def teardown_netns() -> None:
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def node_prefix(node: int, netns: bool) -> list[str]:
    return ["ip", "netns", "exec", NS[node]] if netns else []


def node_env(node: int, netns: bool) -> dict[str, str]:
    env = dict(os.environ)
    if netns:
        env["GLOO_SOCKET_IFNAME"] = IFACES[node]
    return env


# ----------------------------------------------------------------------------- 1. allreduce


def _allreduce_worker(rank: int, sizes_mb: list[int], reps: int, out: str) -> None:
    import torch

    from trainer.config import TrainerConfig
    from trainer.distributed.collectives import flat_all_reduce, hierarchical_all_reduce
    from trainer.distributed.context import init_distributed

    torch.set_num_threads(1)
    ctx = init_distributed(TrainerConfig(backend="gloo", device="cpu", intra_group_size=2, timeout_s=600))
    rows = []
    try:
        for mb in sizes_mb:
            buf = [torch.randn(mb * 2**20 // 4)]
            times: dict[str, list[float]] = {"flat": [], "two_phase": []}
            for _ in range(reps + 1):  # the first round warms the connections
                for name, fn in (("flat", flat_all_reduce), ("two_phase", hierarchical_all_reduce)):
                    ctx.barrier()
                    t0 = time.perf_counter()
                    fn(buf, ctx)
                    times[name].append(time.perf_counter() - t0)
            rows.append({"size_MB": mb, **{k: sorted(v[1:])[len(v[1:]) // 2] for k, v in times.items()}})
    finally:
        ctx.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(rows))


def _worker_main(argv: list[str]) -> None:
    """`python -m bench.comm --worker RANK SIZES REPS OUT` (one allreduce rank, env from the parent)."""
    rank, sizes, reps, out = int(argv[0]), [int(x) for x in argv[1].split(",")], int(argv[2]), argv[3]
    _allreduce_worker(rank, sizes, reps, out)


def bench_allreduce(sizes_mb: list[int], reps: int, netns: bool) -> list[dict[str, Any]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-comm-"))
    out = tmp / "allreduce.json"
    master = ADDRS[0] if netns else "127.0.0.1"
    port = _free_port()
    procs = []
    for rank in range(4):
        node = rank // 2
        env = node_env(node, netns) | {
            "MASTER_ADDR": master,
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": "4",
            "LOCAL_RANK": str(rank % 2),
            "LOCAL_WORLD_SIZE": "2",
            "OMP_NUM_THREADS": "1",
        }
        cmd = [
            *node_prefix(node, netns),
            sys.executable,
            "-m",
            "bench.comm",
            "--worker",
            str(rank),
            ",".join(map(str, sizes_mb)),
            str(reps),
            str(out),
        ]
        procs.append(subprocess.Popen(cmd, env=env, cwd=str(Path(__file__).resolve().parents[1])))
    codes = [p.wait(timeout=1800) for p in procs]
    if any(codes):
        raise RuntimeError(f"allreduce ranks exited with {codes}")
    rows = json.loads(out.read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        r["flat_ms"], r["two_phase_ms"] = r.pop("flat") * 1e3, r.pop("two_phase") * 1e3
        r["two_phase_vs_flat"] = r["flat_ms"] / r["two_phase_ms"]
    return rows


# ----------------------------------------------------------------------------- 2. k-step Adam


def train_two_nodes(tmp: Path, features: Path, k: int, steps_cfg: dict[str, Any], netns: bool) -> dict[str, Any]:
    """Two torchrun nodes x 2 ranks (in the namespaces when `netns`); returns model.json's train stats."""
    from storage.embedding.config import StoreConfig
    from trainer import model_dir
    from trainer.launch.torchrun import torchrun_command, trainer_env

    endpoint = f"{ADDRS[0] if netns else '127.0.0.1'}:{_free_port()}"
    out = tmp / "runs" / f"k{k}" / "model"
    procs = []
    for node in (0, 1):
        spec = train_spec(
            features,
            out,
            tmp / "local" / f"k{k}",
            store=StoreConfig(embedding_dim=16, host_budget_mb=256),
            model=MODEL,
            run_tag=f"k{k}",
            backend="gloo",
            device="cpu",
            nproc_per_node=2,
            nnodes=2,
            node_rank=node,
            rdzv_endpoint=endpoint,
            k_steps=k,
            timeout_s=1800,
            log_every=10_000,
            checkpoint_every=0,
            intra_group_size=2,
            **steps_cfg,
        )
        cfg = spec.trainer
        path = tmp / f"spec-k{k}-n{node}.json"
        spec.write(path)
        cmd = torchrun_command(cfg, str(path), run_id=f"bench-k{k}", log_dir=str(tmp / f"torchrun-k{k}-n{node}"))
        if netns:  # advertise the namespace's address, not the (shared) hostname, to the other node
            cmd = [
                *node_prefix(node, netns),
                *cmd[:3],
                "--local_addr",
                ADDRS[node],
                "--rdzv_conf",
                f"is_host={node == 0}".lower(),
                *cmd[3:],
            ]
        env = trainer_env(cfg) | ({"GLOO_SOCKET_IFNAME": IFACES[node]} if netns else {})
        log = open(tmp / f"k{k}-n{node}.log", "w")  # noqa: SIM115 - closed below
        procs.append(
            (
                subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(Path(__file__).resolve().parents[1])
                ),
                log,
            )
        )
    for p, log in procs:
        code = p.wait(timeout=3600)
        log.close()
        if code:
            raise RuntimeError(f"k={k}: a node exited with {code}:\n{Path(log.name).read_text()[-3000:]}")
    return model_dir.read_meta(str(out)).to_dict()


def bench_k(ks: list[int], steps: int, batch: int, netns: bool, eval_rows: int = 20_000) -> list[dict[str, Any]]:
    from bench.train import write_synthetic_features
    from trainer.eval.scoring import evaluate_model

    tmp = Path(tempfile.mkdtemp(prefix="bench-comm-k-"))
    rows = []
    try:
        features = write_synthetic_features(tmp / "features", 4 * batch * steps, eval_rows=eval_rows)
        for k in ks:
            meta = train_two_nodes(
                tmp, features, k, {"batch_size": batch, "epochs": 1, "lr": 1e-3, "sparse_lr": 1e-2}, netns
            )
            st = meta["train"]
            auc = evaluate_model(str(tmp / "runs" / f"k{k}" / "model"), str(features))["auc"]
            per = 1000 / max(1, st["steps"])
            rows.append(
                {
                    "k": k,
                    "steps": st["steps"],
                    "merges": st["dense_merges"],
                    "sync_MB_per_1k_steps": st["dense_sync_bytes"] / 4 * per / 2**20,  # per rank
                    "sync_s_per_1k_steps": st["dense_sync_s"] * per,
                    "comm_share": st["dense_sync_s"] / st["train_s"],
                    "sparse_MB_per_step": st["sparse_bytes_per_step"] / 2**20,
                    "auc": auc,
                    "examples_per_s": st["examples_per_s"],
                    "paper_comm_share": PAPER.get(k, ""),
                }
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


SMOKE = {"sizes_mb": "1", "reps": 1, "ks": "2", "steps": 4, "batch": 64, "eval_rows": 500, "no_netns": True}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        _worker_main(argv[1:])
        return
    p = argparse.ArgumentParser(prog="python -m bench.comm", description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="1,4,16,64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--ks", default="1,10,50,100,200")
    p.add_argument("--steps", type=int, default=400, help="training steps per k (per-1k-step numbers are scaled)")
    p.add_argument("--batch", type=int, default=256, help="examples per step per rank")
    p.add_argument("--rate", default="1gbit", help="tc netem rate of the link between the namespaces")
    p.add_argument("--delay", default="0.2ms")
    p.add_argument("--no-netns", action="store_true")
    p.add_argument("--eval-rows", type=int, default=20_000, help="rows the AUC of each k is measured on")
    add_smoke(p)
    args = apply_smoke(p.parse_args(argv), SMOKE)
    why = "--no-netns given" if args.no_netns else setup_netns(args.rate, args.delay)
    netns = why is None
    link = (
        f"network namespaces joined by a veth pair, tc {SHAPER['kind']}"
        if netns
        else (f"loopback (network namespaces skipped: {why})")
    )
    print(f"link between the 2 nodes: {link}")
    try:
        sizes = [int(x) for x in args.sizes_mb.split(",")]
        ar = bench_allreduce(sizes, args.reps, netns)
        report(
            "comm_allreduce",
            ar,
            params={"sizes_mb": sizes, "reps": args.reps, "link": link},
            notes="median of reps; 4 ranks = 2 nodes x 2 (intra_group_size=2), gloo",
            columns=["size_MB", "flat_ms", "two_phase_ms", "two_phase_vs_flat"],
        )
        ks = [int(x) for x in args.ks.split(",")]
        kr = bench_k(ks, args.steps, args.batch, netns, args.eval_rows)
        report(
            "comm_kstep",
            kr,
            params={"ks": ks, "steps": args.steps, "batch_per_rank": args.batch, "link": link},
            notes="paper (arXiv 2201.05500): communication share 18.1% at k=10 -> 1.2% at k=200, AUC unchanged; "
            "ours: dense sync seconds / training-loop seconds, per rank, on this machine's link",
            columns=[
                "k",
                "steps",
                "merges",
                "sync_MB_per_1k_steps",
                "sync_s_per_1k_steps",
                "comm_share",
                "paper_comm_share",
                "auc",
                "sparse_MB_per_step",
                "examples_per_s",
            ],
        )
    finally:
        if netns:
            teardown_netns()


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    main()
