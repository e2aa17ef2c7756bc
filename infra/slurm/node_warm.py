"""Prepare one node of a multi-node training job: fetch the train spec, warm this node's SSD shards.

Run once per node, before that node's torchrun (infra/slurm/train.sbatch and
infra/k8s/train-job.yaml do)::

    python infra/slurm/node_warm.py --spec URL_OR_PATH --out /local/spec.json \\
        --nnodes N --my-addr THIS_NODE_ADDR --all-addrs ADDR0,ADDR1,...

Why this exists.  The flow's warm stage warms only the shards of the node the
flow runs on; the flow's train stage writes the spec to
`<root>/runs/date=D/train-spec.json`.  A node that joins a multi-node job needs
a local copy of that spec, and its shards warm before its ranks start (each
rank would otherwise warm its own shard at start-up: `trainer.warmup`).

Which ranks a node gets.  With `--rdzv_backend c10d`, torchrun ignores
`--node_rank` (it warns) and numbers the nodes in the sorted order of their
rendezvous address strings (`torch.distributed.elastic.rendezvous.
dynamic_rendezvous`: `sorted(state.participants)`, participants ordered by
address first).  The launch scripts therefore pass `--local_addr ADDR` to
torchrun and the same ADDR here, so this script can compute the node's group
rank exactly as the rendezvous will: `sorted(all_addrs).index(my_addr)`.

Prints one JSON line: group rank, ranks warmed, the local spec path, the warm report.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:  # run as a script from a checkout or the image's /opt/ctr-pipeline
    sys.path.insert(0, str(_REPO))


def group_rank(my_addr: str, all_addrs: list[str]) -> int:
    """The node's rank under c10d rendezvous: its position among the sorted, distinct addresses."""
    addrs = [a for a in (x.strip() for x in all_addrs) if a]
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"node addresses must be distinct (c10d orders nodes by address), got {addrs}")
    if my_addr not in addrs:
        raise ValueError(f"this node's address {my_addr!r} is not among --all-addrs {addrs}")
    return sorted(addrs).index(my_addr)


def node_ranks(node: int, nproc_per_node: int) -> list[int]:
    """Global ranks torchrun gives the processes of group rank `node` (contiguous per node)."""
    return list(range(node * nproc_per_node, (node + 1) * nproc_per_node))


def fetch_spec(spec_url: str, out: str) -> dict:
    """Copy the spec (a local path or any fsspec URL) to `out` (trainer.main reads a local path)."""
    from storage import fsio

    fs, path = fsio.get_fs(spec_url)
    with fs.open(path, "rt") as f:
        data = json.load(f)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{out}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(out)
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="node_warm.py", description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="train spec JSON: local path or fsspec URL")
    p.add_argument("--out", required=True, help="local path to copy the spec to (what trainer.main reads)")
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, default=0, help="check against the spec (0: take the spec's)")
    p.add_argument("--my-addr", required=True, help="this node's --local_addr given to torchrun")
    p.add_argument("--all-addrs", required=True, help="comma-separated --local_addr of every node")
    p.add_argument("--skip-warm", action="store_true", help="only fetch and check the spec")
    args = p.parse_args(argv)

    data = fetch_spec(args.spec, args.out)
    from trainer.spec import TrainSpec  # validates every section

    spec = TrainSpec.from_dict(data)
    tcfg = spec.trainer
    addrs = args.all_addrs.split(",")
    problems = []
    if tcfg.nnodes != args.nnodes or len(addrs) != args.nnodes:
        problems.append(f"spec trainer.nnodes={tcfg.nnodes}, job nodes={args.nnodes}, addresses={len(addrs)}")
    if args.nproc_per_node and tcfg.nproc_per_node != args.nproc_per_node:
        problems.append(f"spec trainer.nproc_per_node={tcfg.nproc_per_node}, job processes per node={args.nproc_per_node}")
    if problems:
        print("node_warm: the spec does not match the job (shard ownership would be wrong): " + "; ".join(problems),
              file=sys.stderr)
        return 2
    node = group_rank(args.my_addr, addrs)
    ranks = node_ranks(node, tcfg.nproc_per_node)
    report: dict = {"skipped": True}
    if not args.skip_warm:
        report = warm(spec, ranks)
    print(json.dumps({"group_rank": node, "ranks": ranks, "spec": args.out, "warm": report}, default=str))
    return 0


def warm(spec, ranks: list[int]) -> dict:
    """Warm this node's shards before torchrun starts, exactly as its ranks would (`trainer.warmup`).

    The plan (published snapshot, evictions, working set, token) comes with the
    spec; shards already warm for it are left alone, and the ranks then find
    their tokens and skip the work.
    """
    from trainer.warmup import ensure_warm

    world = spec.trainer.nnodes * spec.trainer.nproc_per_node
    return {
        str(rank): ensure_warm(spec.warm, local_dir=spec.local_dir, model_name=spec.model_name, rank=rank,
                               world_size=world, store=spec.store, storage_options=spec.storage_options)
        for rank in ranks
    }


if __name__ == "__main__":
    sys.exit(main())
