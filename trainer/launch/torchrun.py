"""Run a training job with torchrun and read back the committed model directory.

`run_training` is the train stage's function: it writes the train spec, starts
`python -m torch.distributed.run ... -m trainer.main --spec <spec>` as a
subprocess, streams its output to the logger, and returns the train stats the
ranks committed in `model.json`.  A job of one rank on one node without restarts (`alone`: the default on a
machine without GPUs) needs nothing of torchrun's agent, and its rank is started directly, with torchrun's
environment for it (`rank_command`, `rank_env`).

Several nodes: call `run_training` on every node with the same arguments
except `trainer.node_rank` (`trainer.nnodes` > 1 and `trainer.rdzv_endpoint`
= host:port of node 0); `output_url` (and so the checkpoints beside it) must
be storage every node reaches.  Each node's call returns once the model is
committed.

Faults: the ranks checkpoint every `trainer.checkpoint_every` steps into
`<output_url>.checkpoint/`; torchrun restarts failed workers up to
`trainer.max_restarts` times, and they resume from the last checkpoint, as a
rerun of `run_training` with the same arguments does.  The checkpoints are
deleted once the model is committed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from storage.io import fsio
from storage.io.progress import Bar
from trainer import model_dir
from trainer.config import TrainerConfig
from trainer.launch.lifetime import die_with_parent, own_group
from trainer.launch.spec import TrainSpec
from trainer.launch.summary import TrainSummary
from trainer.launch.world import resolve_world
from trainer.model_dir import ModelMeta

log = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parents[2]  # trainer/launch/torchrun.py -> the repository
_TAIL_LINES = 80
_STEP = re.compile(r"\bstep (\d+)/(\d+)\b")  # rank 0's progress lines (trainer.train)


class TrainingError(RuntimeError):
    """The torchrun job failed or timed out; the message ends with the tail of its output."""

    def __init__(self, message: str, *, returncode: int | None, tail: str) -> None:
        super().__init__(f"{message}\n--- last lines of the trainer output ---\n{tail}")
        self.returncode = returncode
        self.tail = tail


@dataclass(frozen=True)
class TrainResult:
    """What the train stage hands on: the committed model directory and what its ranks trained.

    Built in one place, `committed`, from the model's model.json, whether the launcher has just
    trained it (`run_training`) or the train stage reuses a candidate a stopped run committed
    (`flows.day.stages.committed_candidate`).
    """

    model_url: str
    train: TrainSummary
    """What the ranks wrote at the end of training (model.json `train`)."""
    meta: ModelMeta
    wall_s: float = 0.0
    """Seconds the launcher waited for torchrun (0 for a reused candidate: nothing was trained)."""
    nccl_info: tuple[str, ...] = ()
    """The NCCL_DEBUG=INFO lines naming the transport NCCL chose (NET/IB, GDR, sockets), when NCCL ran."""

    @classmethod
    def committed(
        cls, model_url: str, meta: ModelMeta, *, wall_s: float = 0.0, nccl_info: tuple[str, ...] = ()
    ) -> TrainResult:
        """The result of the model committed at `model_url` whose model.json is `meta`.

        Raises:
            ValueError: its `train` section holds a value of the wrong kind (`TrainSummary.from_dict`).
        """
        return cls(model_url, TrainSummary.from_dict(meta.train), meta, wall_s, nccl_info)

    def summary(self) -> str:
        t = self.train
        # a rerun after a stop says what it reused: the committed candidate, or a checkpoint it resumed from
        again = (
            " (the candidate a stopped run committed, reused)"
            if self.wall_s == 0
            else f" (resumed from the checkpoint at step {t.resumed_from_step})"
            if t.resumed_from_step
            else ""
        )
        return (
            f"train: {t.steps} steps on {t.world_size} rank(s), {t.examples} examples"
            + (f" ({t.sampled_out:,} negatives sampled out)" if t.sampled_out else "")
            + f", {t.examples_per_s:,.0f} examples/s, final loss {t.final_loss:.4f}{again}"
            + (f"; {p.summary()}" if (p := t.store_pressure()) else "")
        )


def torchrun_command(
    cfg: TrainerConfig, spec_path: str, *, run_id: str = "ctrpipe", log_dir: str | None = None
) -> list[str]:
    """The argv of the torchrun job (standalone on one node, c10d rendezvous on several); `log_dir`: torchrun's
    own folder (without it torchrun makes a `torchelastic_*` one in the temp dir and leaves it there)."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        cmd += ["--standalone", "--nnodes", "1"]
    else:
        cmd += [
            "--nnodes",
            str(cfg.nnodes),
            "--node_rank",
            str(cfg.node_rank),
            "--rdzv_backend",
            "c10d",
            "--rdzv_endpoint",
            cfg.rdzv_endpoint,
            "--rdzv_id",
            run_id,
        ]
    cmd += ["--nproc_per_node", str(cfg.nproc_per_node), "--max_restarts", str(cfg.max_restarts)]
    if log_dir:
        cmd += ["--log-dir", log_dir]
    cmd += ["-m", "trainer.main", "--spec", spec_path]
    return cmd


def alone(cfg: TrainerConfig) -> bool:
    """Whether the job is one rank on one node that is not restarted: torchrun's agent would only relay for it.

    The agent is a second interpreter with torch imported (about two seconds of a small day's train stage,
    start and exit) that, for such a job, rendezvous with itself, sets five variables and waits; the launcher
    starts that rank itself instead (`rank_command`, `rank_env`), with the same lifetime guards (`_run_streaming`,
    `trainer.launch.lifetime`).  Several ranks, several nodes or `trainer.max_restarts` > 0 go through torchrun.
    """
    return cfg.nnodes == 1 and not cfg.rdzv_endpoint and cfg.nproc_per_node == 1 and cfg.max_restarts == 0


def rank_command(spec_path: str) -> list[str]:
    """The argv of the rank of a job that runs `alone`: what torchrun would start."""
    return [sys.executable, "-m", "trainer.main", "--spec", spec_path]


def rank_env(run_id: str) -> dict[str, str]:
    """What torchrun tells the one rank of a job that runs `alone` (`trainer.distributed.context.init_distributed`
    reads it): rank 0 of a world of one, the job's first attempt."""
    one = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0"}
    sizes = {"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "1"}
    return {
        **one,
        **sizes,
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
    }


def spec_env(cfg: TrainerConfig) -> tuple[dict[str, str], dict[str, str]]:
    """The environment a train spec asks of its ranks, as (defaults, settings).

    Settings: `trainer.nccl_env` as given, one OpenMP thread, unbuffered output, and
    CUBLAS_WORKSPACE_CONFIG with `trainer.deterministic` (cuBLAS is reproducible only with it).
    Defaults (a variable already set wins): NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET where NCCL
    runs (several CUDA ranks), so NCCL logs which network and whether GPUDirect RDMA it uses
    (`TrainResult.nccl_info`).  A one-rank job creates no process group, so it asks for no NCCL
    logging: it would claim an NCCL run that did not happen.  Nothing else of NCCL is set: its own
    defaults hold unless the config says otherwise.

    Raises:
        ValueError: `nproc_per_node` still `auto` (`trainer.launch.world.resolve_world` first).
    """
    defaults: dict[str, str] = {}
    if cfg.backend != "gloo" and cfg.device != "cpu" and cfg.world_size > 1:
        defaults = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    settings = {k: str(v) for k, v in cfg.nccl_env.items()}
    if cfg.deterministic:
        settings["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    settings.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return defaults, settings


def env_file_text(cfg: TrainerConfig) -> str:
    """`spec_env` as a shell file for the jobs that start torchrun themselves (`ctrpipe warm-node
    --env-file`, sourced by infra/slurm/train.sbatch and infra/k8s/train-job.yaml)."""
    defaults, settings = spec_env(cfg)
    lines = ["# the train spec's environment of the ranks (trainer.launch.torchrun.spec_env)"]
    lines += [f'export {k}="${{{k}:-{v}}}"' for k, v in defaults.items()]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def trainer_env(cfg: TrainerConfig) -> dict[str, str]:
    """The environment of the ranks: ours, plus the spec's (`spec_env`), and the repo on the path."""
    defaults, settings = spec_env(cfg)
    env = {**defaults, **os.environ, **settings}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO), env.get("PYTHONPATH", "")) if p)
    return env


_NCCL_TRANSPORT = re.compile(r"NCCL INFO .*(NET/|GDR|GPU ?Direct|Using network|via P2P|via SHM|NCCL version)")
_NCCL_KEEP = 40


def _run_streaming(
    cmd: list[str], env: dict[str, str], *, timeout_s: float, cwd: str, nccl: list[str] | None = None
) -> tuple[int | None, str]:
    """Run `cmd`, logging each output line; kill its whole process group on timeout.

    Args:
        nccl: when given, receives the NCCL transport lines of the output.

    Returns:
        (exit code or None on timeout, the last lines of output).
    """
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
    proc = subprocess.Popen(  # noqa: S603 - torchrun of this interpreter with the run's arguments, no shell
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
        preexec_fn=die_with_parent(),  # a killed flow takes its job with it
    )

    def pump() -> None:
        assert proc.stdout is not None  # noqa: S101 - stdout=PIPE
        with Bar("training steps") as bar:
            for line in proc.stdout:
                line = line.rstrip("\n")
                tail.append(line)
                log.info("%s", line)
                if nccl is not None and len(nccl) < _NCCL_KEEP and _NCCL_TRANSPORT.search(line):
                    nccl.append(line)
                if bar.enabled and (m := _STEP.search(line)):
                    bar.update(int(m.group(1)), total=int(m.group(2)))

    reader = threading.Thread(target=pump, name="torchrun-output", daemon=True)
    reader.start()
    with own_group(proc.pid):  # the job's session is the run's: a Ctrl-C of the run stops it (flows.cli.interrupt)
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
        except BaseException:
            with contextlib.suppress(ProcessLookupError):  # the interrupt's watcher may have stopped it already
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    reader.join(timeout=10)
    return code, "\n".join(tail)


def run_training(spec: TrainSpec, *, work_dir: str, spec_copy_url: str | None = None) -> TrainResult:
    """Train `spec` with torchrun and return the committed model's train stats.

    Args:
        spec: the run, whole: what to read, where to commit, the configs, the run tag.
        work_dir: local directory for the spec file torchrun's ranks read.
        spec_copy_url: also write the spec here (shared storage), so jobs on other nodes can start
            torchrun with the very same spec (infra/k8s/train-job.yaml, infra/slurm/train.sbatch).

    Returns:
        The committed model's URL, meta and train stats.

    Raises:
        TrainingError: torchrun exited non-zero or ran past `trainer.timeout_s`.
        ValueError: more NCCL ranks per node than visible GPUs (before anything starts).
    """
    trainer = resolve_world(spec.trainer)  # `auto` ranks, and no more NCCL ranks than GPUs
    if trainer is not spec.trainer:
        spec = dataclasses.replace(spec, trainer=trainer)
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    spec_path = str(Path(work_dir).resolve() / f"train-spec-{uuid.uuid4().hex[:8]}.json")
    spec.write(spec_path)
    if spec_copy_url:
        fs, path = fsio.get_fs(spec_copy_url, spec.storage_options)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fsio.write_text_atomic(fs, path, Path(spec_path).read_text())
    run_id = f"ctrpipe-{spec.model_name}-{spec.run_tag}".replace("/", "-")
    t0 = time.perf_counter()
    nccl: list[str] = []
    if alone(trainer):  # no torchrun agent to start: the rank itself
        cmd = rank_command(spec_path)
        log.info("launching: %s", " ".join(cmd))
        env = trainer_env(trainer) | rank_env(run_id)
        code, tail = _run_streaming(cmd, env, timeout_s=trainer.timeout_s, cwd=str(_REPO), nccl=nccl)
    else:  # torchrun's folder (empty unless a rank's output is redirected) goes with the job: a day left one
        with tempfile.TemporaryDirectory(prefix="ctrpipe-torchrun-", ignore_cleanup_errors=True) as torchrun_dir:
            cmd = torchrun_command(trainer, spec_path, run_id=run_id, log_dir=torchrun_dir)
            log.info("launching: %s", " ".join(cmd))
            env = trainer_env(trainer)
            code, tail = _run_streaming(cmd, env, timeout_s=trainer.timeout_s, cwd=str(_REPO), nccl=nccl)
    if nccl:
        log.info("NCCL transport:\n%s", "\n".join(nccl))
    wall = time.perf_counter() - t0
    if code is None:
        raise TrainingError(
            f"training timed out after {trainer.timeout_s}s (trainer.timeout_s)", returncode=None, tail=tail
        )
    if code != 0:
        raise TrainingError(f"training failed with exit code {code}", returncode=code, tail=tail)
    meta = model_dir.read_meta(spec.output_url, spec.storage_options)
    return TrainResult.committed(spec.output_url, meta, wall_s=wall, nccl_info=tuple(nccl))
