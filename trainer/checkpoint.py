"""Training checkpoints: what a killed or restarted run resumes from.

    <checkpoint_url>/step-000000120/
        dense-r00000.safetensors   rank 0's model (`model.<name>`), Adam moments (`optim.<name>.exp_avg`, ...,
                                   `optim.step`) and torch RNG state (`rng`): ranks differ between k-step merges
        state-r00000.json          rank 0's counters (examples, loss sum, train seconds, sync and sparse bytes)
        sparse/part-00000.parquet  rank 0's store shard (`EmbeddingStore.snapshot`)
        checkpoint.json            written by rank 0 last, after every rank wrote: the checkpoint is complete
"""

from __future__ import annotations

import re
from typing import Any

from storage.io import fsio
from trainer.model_dir import join

CHECKPOINT_JSON = "checkpoint.json"
_STEP_DIR = re.compile(r"^step-(\d{9})$")


def step_dir(checkpoint_url: str, step: int) -> str:
    return join(checkpoint_url, f"step-{step:09d}")


def rank_dense_name(rank: int) -> str:
    return f"dense-r{rank:05d}.safetensors"


def rank_state_name(rank: int) -> str:
    return f"state-r{rank:05d}.json"


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


def remove_checkpoints(checkpoint_url: str, storage_options: dict | None = None, *, keep_step: int | None = None) -> None:
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
