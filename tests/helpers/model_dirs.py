"""A committed model directory and a day of feature rows written by hand (no torchrun, no pipeline).

The model: 1 dense column `d_0`, 2 key columns `k_0`, `k_1` (fields a, b), dim 2, keys 10..13
trained (in two rank parts), every other key gets its initial row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from storage.embedding.rows.format import RowFormat
from storage.embedding.snapshot import write_snapshot
from storage.io import fsio
from trainer import model_dir
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel

CFG = ModelConfig(num_heads=1, mlp_dims=(4,), dropout=0.0)
DIM = 2
KEYS = (10, 11, 12, 13)


def make_model_dir(root: Path, name: str = "m", *, seed: int = 3) -> tuple[Path, CTRModel, dict[int, torch.Tensor]]:
    """Commit `root/name` (weights drawn with `seed`); returns its path, the dense model and the trained rows."""
    torch.manual_seed(seed)
    model = CTRModel(CFG, num_dense=1, num_fields=2, dim=DIM)
    fs, staging = fsio.get_fs(str(root / f"{name}.staging-x"))
    fs.makedirs(staging + "/sparse")
    rows = {}
    for rank, keys in enumerate(([10, 12], [11, 13])):
        k = torch.tensor(keys)
        emb = torch.randn(len(keys), DIM)
        rows |= {int(a): e for a, e in zip(k, emb, strict=True)}
        fmt = RowFormat(DIM)
        trained = fmt.fresh(emb)
        trained.clock += 1
        write_snapshot(f"{staging}/sparse/part-{rank:05d}.parquet", k, trained, fmt)
    model_dir.write_tensors(f"{staging}/dense.safetensors", model.state_dict())
    meta = model_dir.ModelMeta.of(
        model_name="ctr",
        model_config=CFG,
        dim=DIM,
        init_std=0.5,
        num_dense=1,
        num_fields=2,
        fields=("a", "b"),
        dense_columns=("d_0",),
        key_columns=("k_0", "k_1"),
        vocab_date=None,
        run_tag="t",
        features_url="",
        init_model_url=None,
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(),
    )
    model_dir.write_meta(fs, staging, meta)
    fsio.commit_dir(fs, staging, str(root / name), {"ok": True})
    return root / name, model, rows


def write_feature_day(day: Path, *, train_parts: tuple[int, ...], eval_parts: tuple[int, ...], seed: int = 0) -> None:
    """`day/train/part-*.parquet` and `day/eval/part-*.parquet` with the given rows per part (random rows;
    keys 10..13 and the unknown 99; a label that depends on `d_0`, so AUCs are not 0.5)."""
    rng = np.random.default_rng(seed)
    for split, parts in (("train", train_parts), ("eval", eval_parts)):
        (day / split).mkdir(parents=True)
        for i, n in enumerate(parts):
            d = rng.random(n).astype(np.float32)
            pd.DataFrame(
                {
                    "label": (rng.random(n) < 0.2 + 0.6 * d).astype(np.float32),
                    "d_0": d,
                    "k_0": rng.choice([*KEYS, 99], n),
                    "k_1": rng.choice(KEYS, n),
                    "row": np.arange(n) + 1000 * i,
                }
            ).to_parquet(day / split / f"part-{i:05d}.parquet", index=False)


def committed_feature_day(
    day: Path, *, train_rows: int, seed: int = 0, date: str = "2026-01-04", eval_rows: int = 400
) -> str:
    """A committed features directory of `date` (`write_feature_day` in two train parts and one eval part
    + its manifest), as a url."""
    write_feature_day(
        day, train_parts=(train_rows // 2, train_rows - train_rows // 2), eval_parts=(eval_rows,), seed=seed
    )
    manifest = {
        "date": date,
        "dense_columns": ["d_0"],
        "key_columns": ["k_0", "k_1"],
        "run_id": f"{date}-{seed}",
        "eval_part_rows": [{"name": "part-00000", "rows": eval_rows}],
    }
    (day / "_SUCCESS.json").write_text(json.dumps(manifest))
    return str(day)
