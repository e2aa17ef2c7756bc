"""`ctrpipe warm-node`: a node of a multi-node job gets its spec, checks it against the job and
learns its ranks in the order c10d will number the nodes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from flows.cli.main import main
from storage.embedding.config import StoreConfig
from storage.warm import group_rank, node_ranks
from trainer.config import HetConfig, OptimConfig, TrainerConfig
from trainer.launch.spec import TrainSpec
from trainer.models.config import ModelConfig


def test_group_rank_is_c10d_order() -> None:
    addrs = [f"ctr-train-{i}.ctr-train" for i in range(12)]
    # c10d sorts participants (addr, pid, local_id) and numbers them: the address order decides
    ranks = [group_rank(a, addrs) for a in addrs]
    assert ranks[:2] == [0, 1] and ranks[10] == 2 and ranks[2] == 4, "lexicographic, like sorted() in torch"
    assert sorted(ranks) == list(range(12))
    assert node_ranks(2, 8) == list(range(16, 24))
    with pytest.raises(ValueError, match="not among"):
        group_rank("elsewhere", addrs)
    with pytest.raises(ValueError, match="distinct"):
        group_rank("a", ["a", "a"])


def _spec_dict(tmp_path: Path, nnodes: int, nproc: int) -> dict:
    spec = TrainSpec(
        features_url=str(tmp_path / "root" / "features" / "date=2026-01-05"),
        output_url=str(tmp_path / "root" / "runs" / "date=2026-01-05" / "model"),
        init_model_url=None,
        local_dir=str(tmp_path / "local"),
        model_name="ctr",
        storage_options=None,
        store=StoreConfig(),
        model=ModelConfig(),
        optim=OptimConfig(),
        het=HetConfig(),
        trainer=TrainerConfig(nnodes=nnodes, nproc_per_node=nproc, rdzv_endpoint="h0:29500" if nnodes > 1 else ""),
        run_tag="2026-01-05:abc",
        vocab_date="2026-01-05",
    )
    return spec.to_dict()


def test_warm_node_refuses_a_spec_for_another_world(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "spec.json"
    src.write_text(json.dumps(_spec_dict(tmp_path, nnodes=2, nproc=8)))
    out = tmp_path / "copy" / "spec.json"
    code = main(
        [
            "warm-node",
            "--spec",
            str(src),
            "--out",
            str(out),
            "--nnodes",
            "3",
            "--nproc-per-node",
            "8",
            "--my-addr",
            "a",
            "--all-addrs",
            "a,b,c",
            "--skip-warm",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "trainer.nnodes=2" in err and "shard ownership" in err


def test_warm_node_copies_the_spec_and_picks_ranks(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _spec_dict(tmp_path, nnodes=2, nproc=4)
    src = tmp_path / "spec.json"
    src.write_text(json.dumps(data))
    out = tmp_path / "copy" / "spec.json"
    code = main(
        [
            "warm-node",
            "--spec",
            f"file://{src}",
            "--out",
            str(out),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "4",
            "--my-addr",
            "node-b",
            "--all-addrs",
            "node-b,node-a",
            "--skip-warm",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["group_rank"] == 1 and report["ranks"] == [4, 5, 6, 7]
    assert json.loads(out.read_text()) == json.loads(json.dumps(data))


@pytest.mark.subprocess  # bash sources the written environment
def test_warm_node_writes_the_specs_rank_environment(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _spec_dict(tmp_path, nnodes=2, nproc=4)
    data["trainer"]["nccl_env"] = {"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "bond0"}
    src = tmp_path / "spec.json"
    src.write_text(json.dumps(data))
    env_file = tmp_path / "copy" / "train-env.sh"
    code = main(
        [
            "warm-node",
            "--spec",
            str(src),
            "--out",
            str(tmp_path / "copy" / "spec.json"),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "4",
            "--my-addr",
            "a",
            "--all-addrs",
            "a,b",
            "--skip-warm",
            "--env-file",
            str(env_file),
        ]
    )
    assert code == 0 and json.loads(capsys.readouterr().out)["env_file"] == str(env_file)
    sourced = subprocess.run(
        ["bash", "-c", f"source {env_file} && env"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NCCL_DEBUG": "WARN"},
        check=True,
    ).stdout.splitlines()
    assert {"NCCL_IB_HCA=mlx5_0", "NCCL_SOCKET_IFNAME=bond0", "OMP_NUM_THREADS=1"} <= set(sourced)
    assert "NCCL_DEBUG=WARN" in sourced, "a default never overrides what the job's environment sets"
    assert not any(v.startswith("NCCL_NET_GDR_LEVEL=") for v in sourced), "NCCL's own default unless configured"
