"""`ctrpipe warm-node`: prepare one node of a multi-node training job before its torchrun.

The flow's warm stage warms only the shards of the node it runs on, and writes the train spec to
`runs/<model>/date=D/train-spec.json`.  A node that joins a multi-node job needs a local copy of that spec
and its shards warm before its ranks start (each rank would otherwise warm its own shard at
start-up: `storage.warm.ensure_warm`).  The Slurm script and the Kubernetes Job run this on every
node, then torchrun.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from storage.io import fsio
from storage.io.layout import NodeLayout
from storage.warm import ensure_warm, group_rank, node_ranks
from trainer.launch.spec import TrainSpec
from trainer.launch.torchrun import env_file_text
from trainer.launch.world import resolve_world


class NodeMismatchError(ValueError):
    """The job's shape differs from the spec's: shard ownership (key % world) would be wrong."""


def fetch_spec(spec_url: str, out: str) -> TrainSpec:
    """Copy the spec (a local path or any fsspec URL) to `out` (trainer.main reads a local path); validates it."""
    fs, path = fsio.get_fs(spec_url)
    with fs.open(path, "rt") as f:
        data = json.load(f)
    spec = TrainSpec.from_dict(data)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{out}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(out)
    return spec


def warm_node(
    spec_url: str,
    out: str,
    *,
    nnodes: int,
    nproc_per_node: int,
    my_addr: str,
    all_addrs: list[str],
    warm: bool = True,
    env_file: str | None = None,
) -> dict[str, Any]:
    """Fetch and check the spec, then warm the shards of this node's ranks exactly as they would.

    Args:
        env_file: where to write the spec's environment of the ranks (`trainer.launch.torchrun.env_file_text`:
            `trainer.nccl_env` and the rest), for the job script to source before its torchrun, so a
            job started outside the flow runs with the same NCCL settings as one the flow launches.

    Returns:
        {group_rank, ranks, spec (the local copy), env_file, warm: {rank: report or None (already warm)}}.

    Raises:
        NodeMismatchError: the job's node count, address count or processes per node differ from the spec's.
        ValueError: the spec asks for more NCCL ranks than this node has GPUs.
    """
    spec = fetch_spec(spec_url, out)
    t = resolve_world(spec.trainer)  # `auto` ranks, no more NCCL ranks than this node's GPUs
    addrs = [a for a in (x.strip() for x in all_addrs) if a]
    problems = []
    if t.nnodes != nnodes or len(addrs) != nnodes:
        problems.append(f"spec trainer.nnodes={t.nnodes}, job nodes={nnodes}, addresses={len(addrs)}")
    if nproc_per_node and t.nproc_per_node != nproc_per_node:
        problems.append(f"spec trainer.nproc_per_node={t.nproc_per_node}, job processes per node={nproc_per_node}")
    if problems:
        raise NodeMismatchError(
            "the train spec does not match the job (shard ownership would be wrong): " + "; ".join(problems)
        )
    if env_file:
        Path(env_file).parent.mkdir(parents=True, exist_ok=True)
        Path(env_file).write_text(env_file_text(t))
    node = group_rank(my_addr, addrs)
    ranks = node_ranks(node, t.nproc_per_node)
    reports: dict[str, Any] = {}
    if warm:
        shards = NodeLayout(spec.local_dir, spec.model_name)
        for rank in ranks:
            reports[str(rank)] = ensure_warm(
                spec.warm, shards, rank=rank, store=spec.store, storage_options=spec.storage_options
            )
    return {
        "group_rank": node,
        "ranks": ranks,
        "spec": out,
        "env_file": env_file,
        "warm": reports if warm else {"skipped": True},
    }
