"""End to end: torchrun with 2 gloo ranks on a synthetic features dir -> committed model -> evaluate; a killed
or restarted rank resumes from the last checkpoint bit for bit; two torchrun "nodes" on this machine (c10d
rendezvous) train the same model as one node with 4 ranks."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from storage.embedding.config import StoreConfig
from storage.io.layout import NodeLayout
from tests.helpers.criteo import write_criteo_features
from tests.helpers.faults import crash_once
from tests.helpers.specs import make_spec
from trainer.config import TrainerConfig
from trainer.eval.scoring import evaluate_model, load_model, score
from trainer.launch.summary import TrainSummary
from trainer.launch.torchrun import (
    TrainingError,
    TrainResult,
    alone,
    rank_command,
    rank_env,
    run_training,
    spec_env,
    torchrun_command,
)
from trainer.models.config import ModelConfig
from trainer.models.ctr_model import CTRModel

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

N_DENSE, N_FIELDS, VALUES = 2, 3, 20


def synthetic_rows(n: int, seed: int) -> pd.DataFrame:
    """Clicks driven by field 0's value (half the values click-prone) and by d_0."""
    rng = np.random.default_rng(seed)
    vals = rng.integers(0, VALUES, (n, N_FIELDS))
    x = rng.random((n, N_DENSE)).astype(np.float32)
    logit = np.where(vals[:, 0] < VALUES // 2, 2.0, -2.0) + 2.0 * (x[:, 0] - 0.5)
    label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    cols: dict[str, np.ndarray] = {"label": label}
    cols |= {f"d_{j}": np.log1p(x[:, j] * 10).astype(np.float32) for j in range(N_DENSE)}
    cols |= {f"k_{j}": ((j << 56) | (vals[:, j] + 2)).astype(np.int64) for j in range(N_FIELDS)}
    return pd.DataFrame(cols)


def write_features(root: Path, *, train_rows: int = 4001, eval_rows: int = 1000) -> Path:
    for split, n, seed, parts in (("train", train_rows, 1, 3), ("eval", eval_rows, 2, 1)):
        (root / split).mkdir(parents=True)
        df = synthetic_rows(n, seed)
        for i, chunk in enumerate(np.array_split(np.arange(n), parts)):
            pq.write_table(
                pa.Table.from_pandas(df.iloc[chunk], preserve_index=False), root / split / f"part-{i:05d}.parquet"
            )
    manifest = {
        "rows_train": train_rows,
        "rows_eval": eval_rows,
        "format": "parquet",
        "vocab_date": "2024-01-01",
        "dense_columns": [f"d_{j}" for j in range(N_DENSE)],
        "key_columns": [f"k_{j}" for j in range(N_FIELDS)],
        "fields": [f"C{j + 1}" for j in range(N_FIELDS)],
    }
    (root / "_SUCCESS.json").write_text(json.dumps(manifest))
    return root


STORE = StoreConfig(embedding_dim=8, init_std=0.01, host_budget_mb=16)
MODEL = ModelConfig(num_heads=2, attention_layers=1, mlp_dims=(16,), dropout=0.0)


BASE = {
    "nproc_per_node": 2,
    "backend": "gloo",
    "device": "cpu",
    "k_steps": 4,
    "batch_size": 128,
    "epochs": 2,
    "lr": 1e-2,
    "sparse_lr": 5e-2,
    "timeout_s": 240,
    "log_every": 10,
}


def train(tmp_path: Path, features: Path, out: Path, *, init: Path | None = None, tag: str = "v1", **kw):
    spec = make_spec(
        features, out, tmp_path / "local" / tag, store=STORE, model=MODEL, run_tag=tag, init=init, **(BASE | kw)
    )
    return run_training(spec, work_dir=str(tmp_path / "work"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    tmp = tmp_path_factory.mktemp("e2e")
    features = write_features(tmp / "features" / "date=2024-01-02")
    out = tmp / "runs" / "date=2024-01-02" / "model"
    return tmp, features, train(tmp, features, out)


def test_run_training_commits_the_model_directory(trained) -> None:
    tmp, features, result = trained
    out = Path(result.model_url)
    assert sorted(p.name for p in out.iterdir()) == [
        "_SUCCESS.json",
        "dense.safetensors",
        "dense_optim.safetensors",
        "model.json",
        "sparse",
    ]
    assert sorted(p.name for p in (out / "sparse").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    assert not list(out.parent.glob("model.staging-*"))
    meta = json.loads((out / "model.json").read_text())
    assert meta["model_config"]["arch"] == "attention" and meta["dim"] == 8 and meta["num_dense"] == N_DENSE
    assert meta["key_columns"] == ["k_0", "k_1", "k_2"] and meta["fields"] == ["C1", "C2", "C3"]
    assert meta["vocab_date"] == "2024-01-01" and meta["run_tag"] == "v1"
    st = meta["train"]
    # 4001 rows / 2 ranks = 2000 each (1 dropped), batch 128 -> 16 steps per epoch, 2 epochs
    assert st["steps"] == 32 and st["examples"] == 8000 and st["dropped_rows"] == 1
    assert st["world_size"] == 2 and st["backend"] == "gloo" and st["device"] == "cpu"
    assert st["attention_kernel"] == ("compiled" if shutil.which("cc") else "torch-ops"), st["attention_forwards"]
    assert st["dense_sync_bytes"] > 0 and st["sparse_bytes"] > 0 and st["examples_per_s"] > 0
    assert st["final_loss"] < st["mean_loss"] < 0.75
    assert result.train.steps == 32 and result.train.examples == 8000 and result.train.world_size == 2
    assert result.train == TrainSummary.from_dict(st)  # the launcher reads what rank 0 wrote
    # every key of the train set lives in exactly one rank's part, owned by key % world
    for r in range(2):
        keys = pq.read_table(out / "sparse" / f"part-{r:05d}.parquet").column("key").to_numpy()
        assert len(keys) > 0 and (keys % 2 == r).all()
    optim = load_file(out / "dense_optim.safetensors")
    assert int(optim["step"][0]) == 32
    for r in range(2):  # the local SSD shards now equal this run's model
        shard = Path(NodeLayout(str(tmp / "local" / "v1"), "ctr").shard(r, 2))
        assert json.loads((shard / "meta.json").read_text())["tag"] == "v1"
    dense = load_file(out / "dense.safetensors")
    assert set(dense) == set(CTRModel(MODEL, num_dense=N_DENSE, num_fields=N_FIELDS, dim=8).state_dict())


def test_evaluate_model_learns_the_signal(trained) -> None:
    _, features, result = trained
    metrics = evaluate_model(result.model_url, str(features))  # a features/date=D dir: its eval split
    assert metrics["rows"] == 1000
    assert metrics["auc"] > 0.75, metrics
    assert 0.5 < metrics["calibration"] < 1.5
    same = evaluate_model(result.model_url, str(features / "eval"))
    assert same["auc"] == metrics["auc"]
    loaded = load_model(result.model_url)
    df = synthetic_rows(50, 9)
    df.loc[0, "k_1"] = (1 << 56) | 999_999  # a key never trained: its deterministic initial row
    p = score(loaded, df, batch_size=16)
    assert p.shape == (50,) and np.isfinite(p).all() and ((p > 0) & (p < 1)).all()


def test_warm_start_loads_the_previous_dense_weights(trained) -> None:
    tmp, features, first = trained
    out = tmp / "runs" / "warm" / "model"
    # the warm stage's working set of rank 0, with a key the data never uses: the trainer loads it
    shard0 = Path(NodeLayout(str(tmp / "local" / "v2"), "ctr").shard(0, 2))
    shard0.mkdir(parents=True)
    np.save(shard0 / "working_set.npy", np.array([2 * 123_456_789], dtype=np.int64))
    second = train(tmp, features, out, init=Path(first.model_url), tag="v2", lr=1e-9, sparse_lr=1e-9, epochs=1)
    prev = load_file(Path(first.model_url) / "dense.safetensors")
    now = load_file(out / "dense.safetensors")
    torch.manual_seed(0)  # what a cold start would begin from
    cold = CTRModel(MODEL, num_dense=N_DENSE, num_fields=N_FIELDS, dim=8).state_dict()
    for name in prev:
        torch.testing.assert_close(now[name], prev[name], rtol=0, atol=1e-4)
    assert max((now[n] - cold[n]).abs().max().item() for n in cold) > 0.05
    assert int(load_file(out / "dense_optim.safetensors")["step"][0]) == 32 + 16  # Adam's step continues
    assert second.meta.init_model_url == first.model_url
    assert 2 * 123_456_789 in pq.read_table(out / "sparse" / "part-00000.parquet").column("key").to_numpy()


def test_failed_training_raises_with_the_output_tail_and_leaves_no_torchrun_folder(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "features" / "train").mkdir(parents=True)  # not committed: no _SUCCESS.json
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the launcher's and torchrun's temp dir
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with pytest.raises(TrainingError, match="not committed") as err:
        train(tmp_path, tmp_path / "features", tmp_path / "model", nproc_per_node=1)
    assert err.value.returncode not in (0, None)
    assert not (tmp_path / "model").exists()
    assert list(temp.iterdir()) == []  # torchrun's folder went with the job (a torchelastic_* one was left a run)


def test_torchrun_command_shapes() -> None:
    single = torchrun_command(TrainerConfig(nproc_per_node=4), "/s.json")
    assert "--standalone" in single and single[single.index("--nproc_per_node") + 1] == "4"
    assert single[-4:] == ["-m", "trainer.main", "--spec", "/s.json"] and "--log-dir" not in single
    logged = torchrun_command(TrainerConfig(), "/s.json", log_dir="/t/run")
    assert logged[logged.index("--log-dir") + 1] == "/t/run" and logged[-4:] == single[-4:]
    multi = torchrun_command(TrainerConfig(nnodes=2, node_rank=1, rdzv_endpoint="h:29400"), "/s.json", run_id="x")
    assert "--standalone" not in multi
    assert multi[multi.index("--rdzv_endpoint") + 1] == "h:29400" and multi[multi.index("--node_rank") + 1] == "1"


# ----------------------------------------------------------------------------- checkpoints, resume, restarts


def _assert_same_model(a: Path, b: Path) -> None:
    da, db = load_file(a / "dense.safetensors"), load_file(b / "dense.safetensors")
    for name in da:
        torch.testing.assert_close(db[name], da[name], rtol=0, atol=0)
    for r in range(2):
        ta = pq.read_table(a / "sparse" / f"part-{r:05d}.parquet").sort_by("key")
        tb = pq.read_table(b / "sparse" / f"part-{r:05d}.parquet").sort_by("key")
        assert ta.column("key").equals(tb.column("key"))
        assert ta.column_names == tb.column_names and "emb" in ta.column_names and "clock" in ta.column_names
        for col in ta.column_names:  # weights, the optimizer's state (stochastic rounding included), clocks
            assert ta.column(col).equals(tb.column(col)), col


def test_a_killed_rank_is_resumed_from_the_last_checkpoint_by_a_rerun(trained, monkeypatch) -> None:
    """Also with the reader thread running ahead (the CUDA default; the reference ran without it on CPU):
    the thread changes neither the batches nor the resume position."""
    tmp, features, reference = trained
    assert json.loads((Path(reference.model_url) / "model.json").read_text())["train"]["prefetch_depth"] == 0
    out = tmp / "runs" / "killed" / "model"
    crash_once(monkeypatch, rank=1, step=13, marker=tmp / "killed.marker")  # rank 1 dies after step 13
    with pytest.raises(TrainingError, match="exit code"):
        train(tmp, features, out, tag="killed", checkpoint_every=5, prefetch_batches=2)
    ckpt = Path(f"{out}.checkpoint")
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000000010"]  # the older one was pruned
    assert not out.exists()
    rerun = train(tmp, features, out, tag="killed", checkpoint_every=5, prefetch_batches=2)  # marker exists: no fault
    assert rerun.train.resumed_from_step == 10 and rerun.train.steps == 32 and rerun.train.examples == 8000
    assert rerun.train.prefetch_depth == 2
    assert not ckpt.exists()  # deleted once the model is committed
    _assert_same_model(Path(reference.model_url), out)


def test_max_restarts_restarts_a_rank_that_died_once(trained, monkeypatch) -> None:
    tmp, features, reference = trained
    out = tmp / "runs" / "restarted" / "model"
    crash_once(monkeypatch, rank=0, step=22, marker=tmp / "restart.marker")
    result = train(tmp, features, out, tag="restarted", checkpoint_every=8, max_restarts=1, timeout_s=90)
    assert result.train.resumed_from_step == 16
    _assert_same_model(Path(reference.model_url), out)


def test_a_job_of_one_rank_starts_its_rank_without_torchrun() -> None:
    assert alone(TrainerConfig(nproc_per_node=1))  # the launcher starts `rank_command` with `rank_env` itself
    assert not alone(TrainerConfig(nproc_per_node=2)) and not alone(TrainerConfig(nproc_per_node="auto"))
    assert not alone(TrainerConfig(nproc_per_node=1, max_restarts=1))  # restarts are torchrun's
    assert not alone(TrainerConfig(nproc_per_node=1, nnodes=2, rdzv_endpoint="h:29400"))
    assert rank_command("/s.json")[1:] == ["-m", "trainer.main", "--spec", "/s.json"]
    env = rank_env("ctrpipe-x")
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("0", "0", "1", "1")
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0" and env["TORCHELASTIC_RUN_ID"] == "ctrpipe-x"


def test_torchrun_command_passes_max_restarts() -> None:
    cmd = torchrun_command(TrainerConfig(max_restarts=3), "/s.json")
    assert cmd[cmd.index("--max_restarts") + 1] == "3"


# ----------------------------------------------------------------------------- several nodes


def _train_emulated_nodes(tmp: Path, features: Path, out: Path, tag: str, **kw) -> TrainResult:
    spec = make_spec(
        features,
        out,
        tmp / "local" / tag,
        store=STORE,
        model=MODEL,
        run_tag=tag,
        backend="gloo",
        device="cpu",
        k_steps=4,
        batch_size=250,
        epochs=1,
        lr=1e-2,
        sparse_lr=5e-2,
        timeout_s=240,
        log_every=5,
        intra_group_size=2,
        checkpoint_every=0,
        **kw,
    )
    return run_training(spec, work_dir=str(tmp / "work"))


def _sparse(model_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(sorted((model_dir / "sparse").iterdir()))
    keys = table.column("key").to_numpy()
    emb = np.stack(table.column("emb").to_numpy(zero_copy_only=False))
    order = np.argsort(keys)
    return keys[order], emb[order]


def test_two_nodes_of_two_equal_one_node_of_four(tmp_path: Path, shared_data: Path, free_port: int) -> None:
    features = write_criteo_features(shared_data / "criteo" / "train_head_10k.tsv", tmp_path / "features")
    single = _train_emulated_nodes(tmp_path, features, tmp_path / "single" / "model", "single", nproc_per_node=4)

    out = tmp_path / "multi" / "model"
    results: dict[int, TrainResult | BaseException] = {}

    def node(rank: int) -> None:
        try:
            results[rank] = _train_emulated_nodes(
                tmp_path,
                features,
                out,
                "multi",
                nproc_per_node=2,
                nnodes=2,
                node_rank=rank,
                rdzv_endpoint=f"127.0.0.1:{free_port}",
            )
        except BaseException as exc:  # re-raised below
            results[rank] = exc

    threads = [threading.Thread(target=node, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for r in (0, 1):
        if isinstance(results.get(r), BaseException):
            raise results[r]  # type: ignore[misc]
    multi = results[0]
    assert isinstance(multi, TrainResult) and isinstance(results[1], TrainResult)
    assert results[1].model_url == multi.model_url  # node 1 returns once node 0 committed
    # 9000 train rows / 4 ranks, batch 250 -> 9 steps; the same groups (2 "nodes" x 2) in both runs
    assert multi.train.world_size == single.train.world_size == 4 and multi.train.steps == single.train.steps == 9
    assert multi.train.stats["groups"] == single.train.stats["groups"] == [[0, 1], [2, 3]]
    assert (
        multi.train.stats["dense_merges"] == single.train.stats["dense_merges"] == 3
    )  # steps 4, 8 and the final merge

    d_single, d_multi = load_file(Path(single.model_url) / "dense.safetensors"), load_file(out / "dense.safetensors")
    assert d_single.keys() == d_multi.keys()
    for name in d_single:
        torch.testing.assert_close(d_multi[name], d_single[name], rtol=1e-5, atol=1e-6)
    k_single, e_single = _sparse(Path(single.model_url))
    k_multi, e_multi = _sparse(out)
    np.testing.assert_array_equal(k_multi, k_single)
    np.testing.assert_allclose(e_multi, e_single, rtol=1e-5, atol=1e-6)
    assert abs(multi.train.final_loss - single.train.final_loss) < 1e-5 and multi.train.final_loss < 0.7


def test_the_rank_environment_is_the_specs_and_claims_nccl_only_where_it_runs() -> None:
    one = spec_env(TrainerConfig(nproc_per_node=1, backend="nccl", device="cuda"))
    assert "NCCL_DEBUG" not in one[0], "one rank creates no process group: no NCCL logging to claim NCCL"
    defaults, settings = spec_env(
        TrainerConfig(nproc_per_node=8, nccl_env={"NCCL_IB_HCA": "mlx5_0"}, deterministic=True)
    )
    assert defaults == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert settings["NCCL_IB_HCA"] == "mlx5_0" and settings["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not {"NCCL_SOCKET_IFNAME", "NCCL_NET_GDR_LEVEL"} & set(settings), "NCCL's defaults unless configured"
    assert settings["OMP_NUM_THREADS"] == "1"
    assert "CUBLAS_WORKSPACE_CONFIG" not in spec_env(TrainerConfig(nproc_per_node=2))[1]
