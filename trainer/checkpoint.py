"""Training checkpoints: what a killed or restarted run resumes from.

    <checkpoint_url>/step-000000120/
        rank-00000.safetensors     rank 0's state: the tensors of `{name: component.state_dict()}`
        rank-00000.json            ... and everything else in it, both keyed by path (`model/bias`)
        sparse/part-00000.parquet  rank 0's store shard (`EmbeddingStore.snapshot`)
        checkpoint.json            written by rank 0 last, after every rank wrote: the checkpoint is complete

The state of a rank is a tree of dicts whose leaves are tensors (safetensors) or JSON values; this
module splits and joins it and knows nothing of the components' keys (`trainer.stateful`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from storage.io import fsio
from trainer.model_dir import (
    SPARSE,
    join,
    read_tensors,
    sparse_part_name,
    write_tensors,
)

CHECKPOINT_JSON = "checkpoint.json"
_STEP_DIR = re.compile(r"^step-(\d{9})$")
SEP = "/"
"""Joins the keys of a path into the state tree (component names and state keys never hold it)."""


def step_dir(checkpoint_url: str, step: int) -> str:
    return join(checkpoint_url, f"step-{step:09d}")


def make_step_dir(checkpoint_url: str, step: int, storage_options: dict | None = None) -> str:
    """Create the directory of the checkpoint of `step` (and its `sparse/`); returns its URL."""
    url = step_dir(checkpoint_url, step)
    fs, path = fsio.get_fs(url, storage_options)
    fs.makedirs(fsio.join(path, SPARSE), exist_ok=True)
    return url


def shard_url(step_url: str, rank: int) -> str:
    """Where rank `rank` snapshots its store shard in the checkpoint at `step_url`."""
    return join(step_url, SPARSE, sparse_part_name(rank))


def _rank_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if not isinstance(key, str) or not key or SEP in key:
            raise ValueError(f"state keys must be non-empty strings without {SEP!r}, got {key!r} under {prefix!r}")
        path = prefix + key
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, path + SEP)
        else:
            yield path, value


def _tree(leaves: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in leaves.items():
        *parents, last = path.split(SEP)
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return out


def write_rank_state(step_url: str, rank: int, state: Mapping[str, Any], storage_options: dict | None = None) -> None:
    """Write `state` (a tree of dicts; tensor leaves to safetensors, the others to JSON) of rank `rank`."""
    tensors, values = {}, {}
    for path, leaf in _leaves(state):
        if isinstance(leaf, torch.Tensor):
            tensors[path] = leaf
        else:
            values[path] = leaf
    name = _rank_name(rank)
    write_tensors(join(step_url, f"{name}.safetensors"), tensors, storage_options)
    fs, path = fsio.get_fs(step_url, storage_options)
    fsio.write_json(fs, fsio.join(path, f"{name}.json"), values)


def read_rank_state(step_url: str, rank: int, storage_options: dict | None = None) -> dict[str, Any]:
    """The state `write_rank_state` wrote for rank `rank` (tensors on the CPU)."""
    name = _rank_name(rank)
    tensors = read_tensors(join(step_url, f"{name}.safetensors"), storage_options)
    fs, path = fsio.get_fs(step_url, storage_options)
    return _tree({**fsio.read_json(fs, fsio.join(path, f"{name}.json")), **tensors})


def complete_checkpoints(checkpoint_url: str, storage_options: dict | None = None) -> list[tuple[int, str]]:
    """(step, url) of every complete checkpoint under `checkpoint_url` (holding `checkpoint.json`), oldest first."""
    fs, path = fsio.get_fs(checkpoint_url, storage_options)
    if not fs.isdir(path):
        return []
    out = []
    for entry in fs.ls(path, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        m = _STEP_DIR.match(name)
        if m and fs.exists(fsio.join(entry, CHECKPOINT_JSON)):
            out.append((int(m.group(1)), step_dir(checkpoint_url, int(m.group(1)))))
    return sorted(out)


def read_checkpoint_json(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    fs, path = fsio.get_fs(url, storage_options)
    return fsio.read_json(fs, fsio.join(path, CHECKPOINT_JSON))


def write_checkpoint_json(url: str, meta: dict[str, Any], storage_options: dict | None = None) -> None:
    """Mark the checkpoint at `url` complete (rank 0, once every rank wrote its files)."""
    fs, path = fsio.get_fs(url, storage_options)
    fsio.write_json(fs, fsio.join(path, CHECKPOINT_JSON), meta)


def remove_checkpoints(
    checkpoint_url: str, storage_options: dict | None = None, *, keep_step: int | None = None
) -> None:
    """Delete every step directory (complete or not) except `keep_step`'s; `keep_step=None` deletes the whole dir."""
    fs, path = fsio.get_fs(checkpoint_url, storage_options)
    if not fs.exists(path):
        return
    if keep_step is None:
        fs.rm(path, recursive=True)
        return
    keep = f"step-{keep_step:09d}"
    for entry in fs.ls(path, detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if _STEP_DIR.match(name) and name != keep:
            fs.rm(entry, recursive=True)
