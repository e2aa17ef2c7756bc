"""Typed configuration of training, in three sections of the run config.

- `trainer`: how the job runs: processes and nodes, backend and device, timeouts, restarts,
  checkpoints, the reader thread, logging.  Only the world's shape and the precision change the
  trained model.
- `optim`: what the optimisation does: batch size, epochs, seed, learning rates and their
  schedule, regularisation, and k (the dense k-step Adam merge interval).
- `het`: the worker-side cache of remote embedding rows (HET's bounded staleness).

Every field declares what a change of it does (`storage.io.identity`: `result_field`, `run_field`):
the run identity (`trainer.launch.spec.TrainSpec.identity`) hashes the `optim` and `het` fields and the
world's shape and precision, and not the rest of `trainer`: rerunning a killed day with a longer
timeout or another log interval resumes from that day's checkpoints.

The fields that may be `auto` are numbers only once something decides them for the day and the node:
`trainer.plan.recipe.derive` the `optim` ones (and `model.dropout`), `trainer.launch.world.resolve_world` the
ranks per node.  What they return is a resolved type, `ResolvedOptim` and `ResolvedTrainer` (`ResolvedModel` in
`trainer.models.config`): a subclass of the section whose `auto` fields are plain numbers, so the code after
the decision reads numbers, and a section read back from JSON becomes one by `OptimConfig.resolved`, which
refuses a field still `auto`.  The fields and their roles are the section's: a resolved section hashes and
encodes as the same values in the section do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from storage.embedding.rows.sparse_optim import OPTIMIZERS
from storage.io.identity import result_field, run_field
from trainer.sampling import check_keep_rate

LR_DECAYS = ("none", "linear", "cosine")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTO = "auto"
"""The value of a field derived from the data when training starts."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    """The `trainer` section: how the training job runs (nothing here changes the trained result
    except the world's shape, `nnodes` x `nproc_per_node` and `intra_group_size`)."""

    nproc_per_node: str | int = result_field(
        "auto", why="the world's shape: the rows each rank reads and the k-step averages"
    )
    """Training processes per node (torchrun).  `auto`: one per visible GPU on a CUDA node, one on CPU
    (`trainer.launch.world.resolve_world`); with NCCL at most the node's GPUs."""
    nnodes: int = result_field(1, why="the world's shape")
    """Nodes of the training job (torchrun `--nnodes`); more than 1 needs `rdzv_endpoint`."""
    node_rank: int = run_field(0)
    """This node's rank among the `nnodes` (torchrun `--node_rank`), in [0, nnodes)."""
    rdzv_endpoint: str = run_field("")
    """host:port of the c10d rendezvous for multi-node runs; empty means `--standalone`."""
    backend: str = run_field("auto", why="collectives differ in rounding only")
    """`auto` picks NCCL when CUDA is available, else gloo."""
    device: str = run_field(
        "auto", why="devices differ in rounding only; the checkpoint fingerprint checks the resolved precision"
    )
    """`cuda`, `cpu`, or `auto`: CUDA when a GPU is visible, else the CPU (`trainer.launch.world`)."""
    timeout_s: int = run_field(3600)
    """The training subprocess is killed after this long."""
    nccl_env: dict[str, str] = run_field(factory=dict)
    """NCCL settings exported to every rank (e.g. NCCL_NET_GDR_LEVEL, NCCL_IB_HCA, NCCL_SOCKET_IFNAME)."""
    intra_group_size: int = result_field(0, why="the two-phase allreduce's grouping: the order of the sums")
    """Ranks per phase-1 group of the two-phase allreduce: 0 = detect from the topology (same node and NUMA socket,
    else same node); N > 0 = groups of N consecutive ranks (emulates N ranks per node, or overrides a wrong
    detection); must divide the world size."""
    prefetch_batches: str | int = run_field("auto")
    """Batches the reader thread prepares ahead of the step (0 = read in the training thread); `auto` = 2 on CUDA,
    0 on CPU (`trainer.data.prefetch_depth`)."""
    bind_io_threads: bool = run_field(True)
    """Pin the reader thread to the cores of the rank's NUMA node (no effect on single-node machines)."""
    log_every: int = run_field(100)
    """Steps between progress log lines of rank 0."""
    checkpoint_every: int = run_field(1000)
    """Steps between checkpoints (dense, optimizer, store snapshot, data position), also written at the end; a
    rerun or torchrun restart resumes from the latest.  0 = none."""
    max_restarts: int = run_field(0)
    """torchrun `--max-restarts`: times the job's workers are restarted (from the last checkpoint) after a failure."""
    precision: str = result_field(
        "auto", neutral="auto", why="autocast changes the numerics; `auto` is what runs had before it was hashed"
    )
    """Arithmetic of the dense network (`trainer.precision`): `fp32`, `bf16` or `fp16` autocast with fp32
    master weights and Adam state (fp16 adds loss scaling); `auto` = bf16 on CUDA, fp32 on CPU."""
    deterministic: bool = run_field(False, why="the same sums in a fixed order: it changes rounding only")
    """Bitwise-reproducible CUDA runs (sorted segment sums instead of atomic `index_add_`), at some speed; CPU
    runs are reproducible either way."""

    @property
    def world_size(self) -> int:
        """nnodes x nproc_per_node.

        Raises:
            ValueError: `nproc_per_node` is still `auto` (`trainer.launch.world.resolve_world` fixes it on the node).
        """
        if self.nproc_per_node == "auto":
            raise ValueError(
                "trainer.nproc_per_node is 'auto': resolve it on the node (trainer.launch.world.resolve_world)"
            )
        return self.nnodes * int(self.nproc_per_node)

    def with_nproc(self, nproc: int) -> ResolvedTrainer:
        """This section with `nproc_per_node` the number `nproc` (`trainer.launch.world.resolve_world` decides it)."""
        return ResolvedTrainer(**{**{f.name: getattr(self, f.name) for f in fields(self)}, "nproc_per_node": nproc})

    def __post_init__(self) -> None:
        n = self.nproc_per_node
        if isinstance(n, str) and n.isdigit():  # a number the YAML/CLI loader handed over as text
            object.__setattr__(self, "nproc_per_node", int(n))
        elif n != "auto" and (isinstance(n, bool) or not isinstance(n, int)):
            raise ValueError(f"trainer.nproc_per_node must be 'auto' or an integer >= 1, got {n!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"trainer.precision must be one of {PRECISIONS}, got {self.precision!r}")
        for name in ("nproc_per_node", "nnodes", "timeout_s", "log_every"):
            if name == "nproc_per_node" and self.nproc_per_node == "auto":
                continue
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"trainer.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device not in DEVICES:
            raise ValueError(f"trainer.device must be one of {DEVICES}, got {self.device!r}")
        if self.intra_group_size < 0:
            raise ValueError(f"trainer.intra_group_size must be >= 0 (0 = detect), got {self.intra_group_size}")
        for name in ("checkpoint_every", "max_restarts"):
            if getattr(self, name) < 0:
                raise ValueError(f"trainer.{name} must be >= 0, got {getattr(self, name)}")
        pf = self.prefetch_batches
        if isinstance(pf, str) and pf.isdigit():  # a number the YAML/CLI loader handed over as text
            pf = int(pf)
            object.__setattr__(self, "prefetch_batches", pf)
        if pf != "auto" and (isinstance(pf, bool) or not isinstance(pf, int) or pf < 0):
            raise ValueError(f"trainer.prefetch_batches must be 'auto' or an integer >= 0, got {pf!r}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"trainer.node_rank must be in [0, nnodes), got {self.node_rank}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("trainer.rdzv_endpoint (host:port) is required when trainer.nnodes > 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimConfig:
    """The `optim` section: the optimisation itself; every field changes the trained result.

    The fields marked `auto` depend on the amount of data: `trainer.plan.recipe.derive` sets them from the
    day's train rows and the world size when the day's training starts (an explicit number is kept).
    """

    batch_size: str | int = result_field(AUTO)
    """Examples per step per rank; `auto`: 1024 (8192 on GPU ranks), smaller (down to 128) on a day too small for
    enough steps."""
    epochs: str | int = result_field(AUTO)
    """Passes over the day's rows; `auto`: 1, more (up to 3) on a day of too few steps."""
    seed: int = result_field(0)
    """Seed of the dense network's initial values, dropout and the embedding rows' stochastic rounding; rows start
    from a per-key value (`store.init_std`)."""
    lr: str | float = result_field(AUTO)
    """Adam learning rate of the dense parameters; `auto`: 1e-3, higher (up to 1e-2) for a day of few steps."""
    sparse_optimizer: str = result_field("wide_rowwise_adam", neutral="adam")
    """Update rule of the embedding rows (`storage.embedding.rows.sparse_optim`): `wide_rowwise_adam` (Adam; second
    moment once for column 0, the wide weight, once for the rest: 48 B records at dim 16), `adam` (64 B with int8
    rows), `partial_rowwise_adam`, `rmsprop`, `rowwise_adagrad` or `sgd`.  Another rule's state is converted
    (`sparse_optim.convert_state`).  Why: `docs/reports/2026-12-03-48-byte-rows.md`."""
    sparse_lr: str | float = result_field(AUTO)
    """Learning rate of the embedding rows; `auto`: 2e-2, lower when the day takes several passes.  On a model's
    first day of at most 50,000 train rows, with Adam rows, `auto` picks among 0.5x-4x of that by 5-fold validation
    of a per-key logistic regression (`trainer.plan.sparse_lr_search`, under a second); its later days keep the
    chosen factor (`trainer.plan.day_recipe`)."""
    weight_decay: float = result_field(0.0)
    """Adam's L2 weight decay on the dense parameters and on the embedding rows a step updates (0 = none)."""
    embedding_l2: str | float = result_field(AUTO)
    """L2 on the embedding rows a batch touches (the gradient of (embedding_l2 / 2) * mean_b sum_f ||e_bf||^2);
    `auto`: 0 for one pass, more for each further pass."""
    warmup_steps: str | int = result_field(AUTO)
    """Linear learning-rate warm-up from 0 over this many steps (dense and sparse lr; 0 = none), never
    longer than the day; `auto`: a tenth of the day's steps, at most 100."""
    cross_lr_scale: str | float = result_field(AUTO)
    """The `model.cross` term's learning rate, as a multiple of `lr`; `auto`: 1 on a day of at least
    `trainer.plan.recipe.CROSS_MIN_ROWS` train rows, else 0 (on fewer it fits noise:
    `docs/reports/2026-12-02-cross-term.md`).  At 0 the term is not computed (`CTRModel.hold_cross`)."""
    wide_loss: str | float = result_field(AUTO, neutral=0.0)
    """Weight of a training loss on the `model.wide` term's own logit (with the bias): the deep parts then learn what
    it misses.  `auto`: 1 on a day of fewer than `trainer.plan.recipe.CROSS_MIN_ROWS` train rows, else 0
    (`docs/reports/2026-12-03-wide-loss.md`)."""
    lr_decay: str = result_field("cosine")
    """After warm-up: `none` (constant), `linear` or `cosine` decay to min_lr_ratio * lr at the last step."""
    min_lr_ratio: float = result_field(0.1)
    """Where `lr_decay` ends: the learning rates at the last step are this share of their peak."""
    k_steps: int = result_field(10)
    """Dense parameters and both Adam moments are averaged across ranks every k steps (1 = synchronous)."""
    negative_sampling: float = result_field(1.0, neutral=1.0)
    """Keep-rate w in (0, 1] of the negative train rows (1 = all): every positive trains, a seeded hash picks the
    negatives, eval rows are never sampled; scores get logit + log(w) (`trainer.sampling`)."""
    train_parent_eval: bool = run_field(
        True, why="it changes the model only through TrainSpec.carried, which the identity hashes"
    )
    """Train first on the eval rows of the published model the day starts from (its gate used them; they are its
    day's latest rows: `trainer.plan.parent_eval`), only forward in time, with keys today's vocabulary evicted read as
    OOV; false trains on the day's own train rows only.  The day's own eval rows stay held out for its gate."""

    def __post_init__(self) -> None:
        for name in DERIVED_INTS:
            _set_number(self, name, int)
        for name in DERIVED_FLOATS:
            _set_number(self, name, float)
        if self.sparse_optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optim.sparse_optimizer must be one of {sorted(OPTIMIZERS)}, got {self.sparse_optimizer!r}"
            )
        if self.k_steps < 1:
            raise ValueError(f"optim.k_steps must be >= 1, got {self.k_steps}")
        for name in ("batch_size", "epochs"):
            if _is_number(v := getattr(self, name)) and v < 1:
                raise ValueError(f"optim.{name} must be >= 1 or {AUTO!r}, got {v}")
        for name in ("lr", "sparse_lr"):
            if _is_number(v := getattr(self, name)) and v <= 0:
                raise ValueError(f"optim.{name} must be > 0 or {AUTO!r}, got {v}")
        for name in ("weight_decay", "embedding_l2", "warmup_steps", "cross_lr_scale", "wide_loss"):
            if _is_number(v := getattr(self, name)) and v < 0:
                raise ValueError(f"optim.{name} must be >= 0, got {v}")
        object.__setattr__(self, "negative_sampling", check_keep_rate(self.negative_sampling))
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.lr_decay not in LR_DECAYS:
            raise ValueError(f"optim.lr_decay must be one of {LR_DECAYS}, got {self.lr_decay!r}")

    def unresolved(self) -> list[str]:
        """The `optim.*` keys still `auto` (a spec the trainer runs has none: `trainer.plan.recipe.derive`)."""
        return [f"optim.{n}" for n in (*DERIVED_INTS, *DERIVED_FLOATS) if getattr(self, n) == AUTO]

    def resolved(self) -> ResolvedOptim:
        """This section as the resolved type (itself when it is one): what the ranks train with.

        Raises:
            ValueError: a field is still `auto` (named).
        """
        if isinstance(self, ResolvedOptim):
            return self
        return ResolvedOptim(**{f.name: getattr(self, f.name) for f in fields(self)})


DERIVED_INTS = ("batch_size", "epochs", "warmup_steps")
DERIVED_FLOATS = ("lr", "sparse_lr", "embedding_l2", "cross_lr_scale", "wide_loss")
"""The `optim` fields that may be `auto` (`trainer.plan.recipe`)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _set_number(cfg: OptimConfig, name: str, kind: type) -> None:
    """`auto`, or the field as a number of `kind` (the YAML/CLI loader hands numbers over as text)."""
    value = getattr(cfg, name)
    if value == AUTO:
        return
    try:
        if isinstance(value, bool) or (kind is int and isinstance(value, float)):
            raise ValueError
        number = kind(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"optim.{name} must be {AUTO!r} or {what}, got {value!r}") from None
    object.__setattr__(cfg, name, number)


def refuse_auto(keys: list[str]) -> None:
    """Refuse the config keys `keys` still `auto` where a resolved section is built.

    Raises:
        ValueError: naming them, and what decides them.
    """
    if keys:
        raise ValueError(
            f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} 'auto': derive the day's values with "
            "trainer.plan.recipe.derive (flows.day.stages.train_plan does for a day's spec), or set numbers"
        )


def _declared(cls: type, name: str) -> dict:
    """The field metadata `cls` declares for `name` (its role): a resolved section's field declares the same."""
    return dict(next(f.metadata for f in fields(cls) if f.name == name))


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedTrainer(TrainerConfig):
    """The `trainer` section with `nproc_per_node` a number: the world of a node, fixed
    (`trainer.launch.world.resolve_world`).  `prefetch_batches` may stay `auto`: each rank decides it for its
    device (`trainer.data.prefetch_depth`)."""

    nproc_per_node: int = field(metadata=_declared(TrainerConfig, "nproc_per_node"))

    def __post_init__(self) -> None:
        TrainerConfig.__post_init__(self)
        refuse_auto(["trainer.nproc_per_node"] if self.nproc_per_node == AUTO else [])


_OPTIM = {name: _declared(OptimConfig, name) for name in (*DERIVED_INTS, *DERIVED_FLOATS)}


@dataclass(frozen=True, kw_only=True, slots=True)
class ResolvedOptim(OptimConfig):
    """The `optim` section with every field a number: what `trainer.plan.recipe.derive` returns and the ranks
    train with (`OptimConfig.resolved`).  Built only with every derived field given."""

    batch_size: int = field(metadata=_OPTIM["batch_size"])
    epochs: int = field(metadata=_OPTIM["epochs"])
    lr: float = field(metadata=_OPTIM["lr"])
    sparse_lr: float = field(metadata=_OPTIM["sparse_lr"])
    embedding_l2: float = field(metadata=_OPTIM["embedding_l2"])
    warmup_steps: int = field(metadata=_OPTIM["warmup_steps"])
    cross_lr_scale: float = field(metadata=_OPTIM["cross_lr_scale"])
    wide_loss: float = field(metadata=_OPTIM["wide_loss"])

    def __post_init__(self) -> None:
        OptimConfig.__post_init__(self)  # text to numbers, and their bounds
        refuse_auto(self.unresolved())


@dataclass(frozen=True, kw_only=True, slots=True)
class HetConfig:
    """The `het` section: HET's worker-side cache of remote rows with a staleness bound (trainer/distributed)."""

    staleness_bound: int = result_field(0)
    """Bounded staleness in row updates (per-row clocks): a cached copy of a remote row serves while the owner's
    updates since the fetch plus this rank's unpushed ones stay <= bound; the rank pushes its summed updates when
    the bound would be crossed or the copy is evicted.  0 = synchronous (no cache)."""
    cache_rows: int = result_field(1_000_000, why="evicting a copy pushes its pending gradients early")
    """Capacity, in rows, of each rank's cache (when staleness_bound > 0); the least frequently used
    copies are evicted (their pending gradients pushed) beyond it."""

    def __post_init__(self) -> None:
        if self.staleness_bound < 0:
            raise ValueError(f"het.staleness_bound must be >= 0, got {self.staleness_bound}")
        if self.cache_rows < 1:
            raise ValueError(f"het.cache_rows must be >= 1, got {self.cache_rows}")
