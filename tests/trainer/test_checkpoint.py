"""A rank's state round-trips through a checkpoint whatever its components hold; only complete
checkpoints are found, and pruning keeps the one asked for."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trainer import checkpoint


def test_a_rank_state_of_nested_tensors_and_values_round_trips(tmp_path: Path) -> None:
    url = checkpoint.make_step_dir(str(tmp_path / "ckpt"), 7)
    state = {
        "model": {"over.mlp.0.weight": torch.randn(3, 2), "bias": torch.tensor(0.5)},
        "optim": {"moments": {"step": torch.tensor([4])}, "steps": 4, "sync_seconds": 0.25},
        "sparse": {"bytes_by_kind": {"push": 10, "clock": 0}, "steps": 4},
        "reader": {"position": 7, "share": [0, 10]},
        "progress": {"last_loss": float("nan"), "empty": {}},
        "rng": {"cpu": torch.get_rng_state()},
    }
    checkpoint.write_rank_state(url, 3, state)
    back = checkpoint.read_rank_state(url, 3)
    assert back.keys() == state.keys()
    assert back["optim"]["steps"] == 4 and back["optim"]["sync_seconds"] == 0.25
    assert back["sparse"] == state["sparse"] and back["reader"] == state["reader"]
    assert math.isnan(back["progress"]["last_loss"]) and back["progress"]["empty"] == {}
    for a, b in (
        (back["model"], state["model"]),
        (back["optim"]["moments"], state["optim"]["moments"]),
        (back["rng"], state["rng"]),
    ):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    with pytest.raises(ValueError, match="state keys must be non-empty strings without '/'"):
        checkpoint.write_rank_state(url, 0, {"model": {"a/b": torch.zeros(1)}})


def test_only_complete_checkpoints_count_and_pruning_keeps_one(tmp_path: Path) -> None:
    root = str(tmp_path / "ckpt")
    assert checkpoint.complete_checkpoints(root) == []
    for step in (5, 10, 15):
        url = checkpoint.make_step_dir(root, step)
        if step != 15:  # the last one was cut short before rank 0 marked it complete
            checkpoint.write_checkpoint_json(url, {"step": step, "run_tag": "t"})
    done = checkpoint.complete_checkpoints(root)
    assert [s for s, _ in done] == [5, 10] and checkpoint.read_checkpoint_json(done[-1][1])["run_tag"] == "t"
    checkpoint.remove_checkpoints(root, keep_step=10)
    assert sorted(p.name for p in Path(root).iterdir()) == ["step-000000010"]
    checkpoint.remove_checkpoints(root)
    assert not Path(root).exists()
