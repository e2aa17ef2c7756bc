"""The companion's file, `companion.safetensors`: its weights and the fit rows' key counts, no pickles.

Written beside the model's dense files by rank 0 (`trainer.commit`) and copied whole into the serving bundle
(`flows.serving.export`); read by every scorer (`trainer.eval.scoring`, `flows.serving.model`).
"""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from storage.io import fsio
from trainer.companion.key_counts import KeyCounts
from trainer.companion.model import Companion
from trainer.companion.poly2 import Poly2

FILE = "companion.safetensors"
"""Its name in the model directory and the bundle."""


def to_bytes(companion: Companion) -> bytes:
    """The companion as a safetensors file (no pickles)."""
    p = companion.poly2
    return st_save(
        {
            "buckets": np.ascontiguousarray(p.buckets, dtype=np.int64),
            "weights": p.weights.astype(np.float32),
            "dense_weights": p.dense_weights.astype(np.float32),
            "bias": np.array([p.bias], dtype=np.float32),
            "C": np.array([p.C], dtype=np.float64),
            "bits": np.array([companion.bits], dtype=np.int64),
            **(
                {}
                if companion.counts is None
                else {"count_keys": companion.counts.keys, "count_values": companion.counts.counts.astype(np.int32)}
            ),
        }
    )


def from_bytes(data: bytes | bytearray, where: str, *, blend_weight: float) -> Companion:
    """A companion from `to_bytes`'s file, blended at `blend_weight` (its model.json record's,
    `trainer.companion.model.blend_weight_of`: the file holds the weights alone).

    Raises:
        ValueError: the file is not a companion (the message names `where`).
    """
    try:
        t = st_load(bytes(data))
        poly2 = Poly2(
            buckets=t["buckets"].astype(np.int64),
            weights=t["weights"].astype(np.float64),
            dense_weights=t["dense_weights"].astype(np.float64),
            bias=float(t["bias"][0]),
            C=float(t["C"][0]),
        )
        bits = int(t["bits"][0])
        counts = (
            KeyCounts(t["count_keys"].astype(np.int64), t["count_values"].astype(np.int64))
            if "count_keys" in t
            else None
        )
    except Exception as exc:  # safetensors raises its own types on a bad file
        raise ValueError(f"{where} is not a companion file ({type(exc).__name__}: {exc}); retrain the model") from None
    if poly2.buckets.shape != poly2.weights.shape:
        raise ValueError(f"{where}: {poly2.buckets.size} buckets but {poly2.weights.size} weights; retrain the model")
    return Companion(poly2, bits, counts, blend_weight)


def save(url: str, companion: Companion, storage_options: dict | None = None) -> None:
    fs, path = fsio.get_fs(url, storage_options)
    with fs.open(path, "wb") as f:
        f.write(to_bytes(companion))


def load(url: str, storage_options: dict | None = None, *, blend_weight: float) -> Companion:
    """The companion file at `url`, blended at `blend_weight` (`from_bytes`).

    Raises:
        FileNotFoundError: no file there (a model.json that names a companion needs it).
    """
    fs, path = fsio.get_fs(url, storage_options)
    if not fs.exists(path):
        raise FileNotFoundError(f"{url} is missing: the model's model.json names a companion; retrain the model")
    with fs.open(path, "rb") as f:
        return from_bytes(f.read(), url, blend_weight=blend_weight)
