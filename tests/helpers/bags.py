"""Batches with one bag field and the plain-torch reference of their pooled embeddings (`trainer.bags`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trainer.bags import FieldBags, Jagged
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel

V, D = 40, 4  # keys 0..V-1, embedding width
BAG_FIELD = 1  # of 3 fields; keys of field f are f, f+3, f+6, ... (disjoint across fields)
MISSING = 1  # the bag field's "missing key" in these tests


def field_bags(lists: list[list[int]], field: int = BAG_FIELD) -> FieldBags:
    lengths = np.array([len(x) for x in lists], dtype=np.int64)
    values = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]) if lists else np.empty(0, np.int64)
    return FieldBags.from_jagged(field, Jagged(values=values, offsets=np.concatenate([[0], np.cumsum(lengths)])))


def random_bag_batch(seed: int, B: int = 6) -> tuple[torch.Tensor, list[list[int]]]:
    """(keys (B, 3), bags of field 1): every third bag is empty, and then k_1 is the missing key."""
    g = np.random.default_rng(seed)
    keys = torch.from_numpy(np.stack([g.integers(0, V // 3, B) * 3 + f for f in range(3)], 1).astype(np.int64))
    lists = []
    for b in range(B):
        n = 0 if b % 3 == 2 else int(g.integers(1, 5))
        lists.append([int(k) for k in g.integers(1, V // 3, n) * 3 + BAG_FIELD])  # repeats allowed
        keys[b, BAG_FIELD] = lists[-1][0] if n else MISSING
    return keys, lists


def reference_emb(table: nn.Parameter, keys: torch.Tensor, lists: list[list[int]], mode: str) -> torch.Tensor:
    """emb (B, 3, D) the plain torch way: rows of the keys, the bag field through nn.EmbeddingBag."""
    bag = nn.EmbeddingBag(V, D, mode=mode)
    bag.weight = table
    flat = torch.tensor([k for x in lists for k in x], dtype=torch.int64)
    offsets = torch.tensor(np.cumsum([0] + [len(x) for x in lists[:-1]]), dtype=torch.int64)
    pooled = bag(flat, offsets)  # (B, D); an empty bag gives zeros
    empty = torch.tensor([not x for x in lists])
    pooled = torch.where(empty.unsqueeze(1), table[keys[:, BAG_FIELD]], pooled)  # empty bag -> missing key's row
    emb = table[keys]  # (B, 3, D)
    return torch.cat([emb[:, :BAG_FIELD], pooled.unsqueeze(1), emb[:, BAG_FIELD + 1 :]], dim=1)


def bag_model(mode: str, arch: str = "attention") -> CTRModel:
    """A seeded small model over 2 dense features and the 3 fields, pooling bags with `mode`."""
    torch.manual_seed(0)
    cfg = ModelConfig(dropout=0.0, arch=arch, num_heads=2, mlp_dims=(8,), dense_buckets=0, bag_pooling=mode)
    return CTRModel(cfg, num_dense=2, num_fields=3, dim=D)
