"""Typed configuration of the model, the trainer and the publish gate."""

from __future__ import annotations

from dataclasses import dataclass, field

ARCHS = ("attention", "lr", "dnn", "deepfm", "dcn_v2")
LR_DECAYS = ("none", "linear", "cosine")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
BAG_POOLINGS = ("mean", "sum", "none")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    arch: str = "attention"
    """Architecture: `attention` (embeddings -> multi-head self-attention over fields -> MLP -> sigmoid),
    or a reference: `lr`, `dnn`, `deepfm`, `dcn_v2` (see trainer/models/reference.py)."""
    num_heads: int = 2
    """Attention heads; must divide store.embedding_dim."""
    attention_layers: int = 1
    mlp_dims: tuple[int, ...] = (256, 128)
    """Hidden widths of the MLP on top of the attended field embeddings and the dense features."""
    dropout: float = 0.0
    """Dropout after each hidden MLP layer (and in attention)."""
    dense_buckets: int = 16
    """Bucketise each log1p dense feature into this many buckets with a learned token each (0 = off,
    else >= 3); bucket 0 holds x <= 0 and missing values, which encode maps to the same 0.  The raw
    log1p values are used as well.  (Default 0 before the quality work: a model published with 0 cannot
    warm-start a run with buckets, the MLP input differs; pin 0, or start that run cold.)"""
    dense_bucket_max: float = 12.0
    """Upper edge, on the log1p scale, of the last closed dense bucket (values above share one bucket)."""
    cross_layers: int = 3
    """Cross layers of `dcn_v2` (and of the attention model's `cross_tower`)."""
    cross_rank: int = 0
    """Rank r of every cross layer's W = U V^T (DCN-V2's low-rank form; 0 = full rank d x d)."""
    cross_tower: bool = False
    """`attention` only: add a DCN-V2 cross network (`cross_layers` layers, `cross_rank`) over x0 = the flattened
    field (and dense bucket) embeddings, parallel to attention + MLP, its zero-initialised linear head added to
    the logit (a DCN / AutoInt+ hybrid).  The raw log1p dense values stay out of x0: the cross products square
    them (values up to ~12), which overfit Criteo.  Off by default: see bench/quality.py, issue 7 round 6."""
    fm: bool = False
    """`attention` only: add the FM second-order term (sum of <v_i, v_j> over field pairs, v = e[1:], e[0] being
    the wide term's key weight) to the logit.  Off by default: see bench/quality.py, issue 7 round 6."""
    wide: bool = True
    """`attention` only: add a wide (logistic-regression) term to the logit, sum_f e_f[0] + <a, dense>,
    so memorised per-key weights and the deep interactions are learned together (Wide & Deep)."""
    wide_scale: float = 1.0
    """The wide term uses wide_scale * e_f[0]: the key weights' effective step (sparse_lr * wide_scale)
    and L2 (embedding_l2 / wide_scale^2, in logit units) apart from the deep dimensions'."""
    bag_pooling: str = "mean"
    """How a multi-valued field's bag of keys (`bag_j` in features) becomes the field's one embedding row:
    `mean` or `sum` of the bag's rows (an empty bag uses the missing key's row), or `none` to ignore the
    bags and use the first value's key `k_j`.  Reshapes no parameter: a change keeps the warm start."""

    def __post_init__(self) -> None:
        if self.dense_buckets < 0 or 0 < self.dense_buckets < 3:
            raise ValueError(f"model.dense_buckets must be 0 (off) or >= 3, got {self.dense_buckets}")
        if self.wide_scale <= 0:
            raise ValueError(f"model.wide_scale must be > 0, got {self.wide_scale}")
        if self.dense_bucket_max <= 0 or self.cross_layers < 0 or self.cross_rank < 0:
            raise ValueError("model.dense_bucket_max must be > 0, model.cross_layers and model.cross_rank >= 0")
        if self.bag_pooling not in BAG_POOLINGS:
            raise ValueError(f"model.bag_pooling must be one of {BAG_POOLINGS}, got {self.bag_pooling!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"model.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.num_heads < 1 or self.attention_layers < 0:
            raise ValueError("model.num_heads must be >= 1 and model.attention_layers >= 0")
        if not self.mlp_dims or any(d < 1 for d in self.mlp_dims):
            raise ValueError(f"model.mlp_dims must be positive widths, got {self.mlp_dims}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    nproc_per_node: int = 1
    """Training processes per node, launched by torchrun (one per GPU on GPU nodes)."""
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""
    """host:port of the c10d rendezvous for multi-node runs; empty means `--standalone`."""
    backend: str = "auto"
    """`auto` picks NCCL when CUDA is available, else gloo."""
    device: str = "auto"
    k_steps: int = 10
    """Dense parameters and both Adam moments are averaged across ranks every k steps (1 = synchronous)."""
    batch_size: int = 1024
    """Examples per step per rank."""
    epochs: int = 1
    lr: float = 1e-3
    """Adam learning rate of the dense parameters."""
    sparse_lr: float = 2e-2
    """Adam learning rate of the embedding rows (was 1e-2; 2e-2 with the cosine schedule is better on a
    day-sized sample, bench/quality.py)."""
    weight_decay: float = 0.0
    embedding_l2: float = 0.0
    """L2 on the embedding rows a batch touches: adds embedding_l2 * row / B to the gradient of every
    pulled row occurrence (the gradient of (embedding_l2 / 2) * mean_b sum_f ||e_bf||^2)."""
    warmup_steps: int = 100
    """Linear learning-rate warm-up from 0 over this many steps (dense and sparse lr), at most a tenth
    of the run's steps (0 = none)."""
    lr_decay: str = "cosine"
    """After warm-up: `none` (constant), `linear` or `cosine` decay to min_lr_ratio * lr at the last step."""
    min_lr_ratio: float = 0.1
    seed: int = 0
    staleness_bound: int = 0
    """HET bounded staleness of the worker-side cache of remote rows, in row updates (per-row clocks): a
    cached copy is served while (owner's updates since the fetch + this rank's updates not yet pushed)
    <= bound; the rank applies its own updates to the copy and pushes their sum when the bound would be
    crossed, the copy is evicted, or it is dirty and bound steps old (0 = synchronous; trainer/staleness.py)."""
    timeout_s: int = 3600
    """The training subprocess is killed after this long."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """NCCL settings exported to every rank (e.g. NCCL_NET_GDR_LEVEL, NCCL_IB_HCA, NCCL_SOCKET_IFNAME)."""
    intra_group_size: int = 0
    """Ranks per phase-1 group of the two-phase allreduce.  0 = detect from the topology (ranks on the
    same node and NUMA socket, else the same node); N > 0 = groups of N consecutive ranks (emulates
    N ranks per node on one machine, or overrides a wrong detection); must divide the world size."""
    prefetch_batches: str | int = "auto"
    """Batches the background reader thread prepares ahead of the training step (bounded queue); 0 = read
    in the training thread (no pipelining); `auto` = 2 on a CUDA device, 0 on CPU, where reading is cheap
    next to the step and the thread only competes with it (`trainer.data.prefetch_depth`)."""
    bind_io_threads: bool = True
    """Pin the reader thread to the cores of the rank's NUMA node (no effect on single-node machines)."""
    log_every: int = 100
    """Steps between progress log lines of rank 0."""
    checkpoint_every: int = 1000
    """Steps between checkpoints (dense + optimizer state + store snapshot + data position), also written at
    the end; a rerun (or a torchrun restart) resumes from the latest one.  0 = no checkpoints."""
    max_restarts: int = 0
    """torchrun `--max-restarts`: times the job's workers are restarted (from the last checkpoint) after a failure."""
    staleness_cache_rows: int = 1_000_000
    """Capacity, in rows, of each rank's HET cache of remote rows (used when staleness_bound > 0); the
    least frequently used copies are evicted (their pending gradients pushed) beyond it."""
    malloc_trim_threshold: int = 256 << 20
    """glibc M_TRIM_THRESHOLD (bytes) of each rank: free memory at the top of the heap kept instead of
    handed back to the OS; 0 leaves glibc's dynamic default (see `trainer.main.tune_malloc`)."""
    malloc_mmap_threshold: int = 32 << 20
    """glibc M_MMAP_THRESHOLD (bytes, at most 32 MiB) of each rank: smaller blocks come from the heap, not from
    a fresh mmap per tensor; 0 leaves glibc's dynamic default (see `trainer.main.tune_malloc`)."""

    def __post_init__(self) -> None:
        for name in (
            "nproc_per_node", "nnodes", "k_steps", "batch_size", "epochs", "timeout_s", "log_every", "staleness_cache_rows"
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"trainer.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device not in DEVICES:
            raise ValueError(f"trainer.device must be one of {DEVICES}, got {self.device!r}")
        if self.lr <= 0 or self.sparse_lr <= 0:
            raise ValueError("trainer.lr and trainer.sparse_lr must be > 0")
        if self.embedding_l2 < 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("trainer.embedding_l2 and trainer.warmup_steps must be >= 0, min_lr_ratio in [0, 1]")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"trainer.lr_decay must be one of {LR_DECAYS}, got {self.lr_decay!r}")
        if self.intra_group_size < 0:
            raise ValueError(f"trainer.intra_group_size must be >= 0 (0 = detect), got {self.intra_group_size}")
        for name in ("checkpoint_every", "max_restarts", "malloc_trim_threshold"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name} must be >= 0, got {getattr(self, name)}")
        pf = self.prefetch_batches
        if isinstance(pf, str) and pf.isdigit():  # a number the YAML/CLI loader handed over as text
            pf = int(pf)
            object.__setattr__(self, "prefetch_batches", pf)
        if pf != "auto" and (isinstance(pf, bool) or not isinstance(pf, int) or pf < 0):
            raise ValueError(f"trainer.prefetch_batches must be 'auto' or an integer >= 0, got {pf!r}")
        if not 0 <= self.malloc_mmap_threshold <= 32 << 20:  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
            raise ValueError(
                f"trainer.malloc_mmap_threshold must be in [0, {32 << 20}] (glibc's maximum), "
                f"got {self.malloc_mmap_threshold}"
            )
        if self.staleness_bound < 0:
            raise ValueError(f"trainer.staleness_bound must be >= 0, got {self.staleness_bound}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"trainer.node_rank must be in [0, nnodes), got {self.node_rank}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("trainer.rdzv_endpoint (host:port) is required when trainer.nnodes > 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class PublishConfig:
    max_auc_drop: float = 0.01
    """Refuse to publish when the new model's AUC is below the published one's by more than this."""
    min_eval_rows: int = 100
    """Refuse to publish a model evaluated on fewer rows than this."""
    lock_timeout_s: float = 6 * 3600
    """How long a run waits for another run of the same model to finish training/publishing before failing."""

    def __post_init__(self) -> None:
        if self.max_auc_drop < 0:
            raise ValueError(f"publish.max_auc_drop must be >= 0, got {self.max_auc_drop}")
        if self.min_eval_rows < 1:
            raise ValueError(f"publish.min_eval_rows must be >= 1, got {self.min_eval_rows}")
        if self.lock_timeout_s <= 0:
            raise ValueError(f"publish.lock_timeout_s must be > 0, got {self.lock_timeout_s}")
