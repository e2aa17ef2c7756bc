"""Reading and writing the dense files of a model directory (see docs/ARCHITECTURE.md).

    model.json               architecture, configs, columns, train stats
    dense.safetensors        the model's state_dict
    dense_optim.safetensors  `<param>.exp_avg`, `<param>.exp_avg_sq` per parameter, and `step`

Safetensors only: a model directory never holds pickles.
"""

from __future__ import annotations

from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from storage import fsio

MODEL_JSON = "model.json"
DENSE = "dense.safetensors"
DENSE_OPTIM = "dense_optim.safetensors"
SPARSE = "sparse"

join = fsio.join


def sparse_part_name(rank: int) -> str:
    return f"part-{rank:05d}.parquet"


def write_tensors(url: str, tensors: dict[str, torch.Tensor], storage_options: dict | None = None) -> None:
    fs, path = fsio.get_fs(url, storage_options)
    data = st_save({k: v.detach().cpu().contiguous() for k, v in tensors.items()})
    with fs.open(path, "wb") as f:
        f.write(data)


def read_tensors(url: str, storage_options: dict | None = None) -> dict[str, torch.Tensor]:
    fs, path = fsio.get_fs(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(url)
    with fs.open(path, "rb") as f:
        return st_load(f.read())


def read_model_json(model_url: str, storage_options: dict | None = None) -> dict[str, Any]:
    """`model.json` of a committed model directory.

    Raises:
        FileNotFoundError: the directory is not committed (no `_SUCCESS.json`) or has no model.json.
    """
    fs, path = fsio.get_fs(model_url, storage_options)
    if fsio.read_manifest(fs, path) is None:
        raise FileNotFoundError(f"{model_url} is not a committed model directory (no {fsio.SUCCESS})")
    return fsio.read_json(fs, fsio.join(path, MODEL_JSON))
