"""Process groups, the two-phase allreduce of dense tensors, and the all-to-all exchange of sparse rows.

`init_distributed` builds every process group once and returns them in a
`DistContext` that callers pass down explicitly (no module globals).  Every
collective here bypasses communication when the world has one rank.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import socket as _socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from storage.base import EmbeddingStore, owner_of
from trainer.config import TrainerConfig
from trainer.staleness import StaleRowCache
from trainer.topology import (
    RankPlace,
    TwoPhaseGroups,
    detect_socket,
    emulated_places,
    two_phase_groups,
)

log = logging.getLogger(__name__)

OPS = ("avg", "sum")


@dataclass
class DistContext:
    """Everything a rank knows about the job's processes; built once by `init_distributed`.

    Attributes:
        rank, world_size, local_rank, local_world_size: from the torchrun environment.
        backend: `nccl` or `gloo` (`none` when the world has one rank and no process group).
        device: where the model computes (`cuda:<local_rank>` or `cpu`).
        comm_device: where tensors must be for collectives (the device for NCCL, CPU for gloo).
        places: the (node, socket) of every rank.
        topology: the two-phase groups computed from `places`.
        intra_group: this rank's phase-1 process group (None when the group has one rank).
        leader_group: the phase-2 group of the leaders (None on non-leaders or with one group).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device
    comm_device: torch.device
    places: list[RankPlace]
    topology: TwoPhaseGroups
    intra_group: dist.ProcessGroup | None = None
    leader_group: dist.ProcessGroup | None = None
    initialized_pg: bool = field(default=False, repr=False)

    @property
    def leader(self) -> int:
        return self.topology.leader(self.rank)

    @property
    def is_leader(self) -> bool:
        return self.topology.is_leader(self.rank)

    @property
    def socket(self) -> int:
        return self.places[self.rank].socket

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def destroy(self) -> None:
        """Destroy the process groups this context created (idempotent)."""
        if self.initialized_pg and dist.is_initialized():
            dist.destroy_process_group()
        self.initialized_pg = False
        self.intra_group = self.leader_group = None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def pick_backend_and_device(cfg: TrainerConfig, local_rank: int) -> tuple[str, torch.device]:
    """NCCL + `cuda:<local_rank>` when CUDA is available and allowed by the config, else gloo + CPU.

    Raises:
        ValueError: the config asks for CUDA or NCCL on a machine without CUDA.
    """
    cuda = torch.cuda.is_available()
    if cfg.device == "cuda" and not cuda:
        raise ValueError("trainer.device='cuda' but CUDA is not available; use device='auto' or 'cpu'")
    if cfg.backend == "nccl" and (not cuda or cfg.device == "cpu" or not dist.is_nccl_available()):
        raise ValueError("trainer.backend='nccl' needs CUDA and an NCCL build of torch; use backend='auto' or 'gloo'")
    use_cuda = cuda and cfg.device != "cpu"
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}") if use_cuda else torch.device("cpu")
    if cfg.backend == "auto":
        backend = "nccl" if use_cuda and dist.is_nccl_available() else "gloo"
    else:
        backend = cfg.backend
    return backend, device


def init_distributed(cfg: TrainerConfig, *, timeout_s: float | None = None) -> DistContext:
    """Join the job described by the torchrun environment and build the two-phase groups.

    Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (and MASTER_ADDR/PORT
    through `env://`).  Without WORLD_SIZE, or with a world of one, no process
    group is created and every collective becomes a no-op.

    Args:
        cfg: backend/device choice and `intra_group_size` (0 = detect node + socket).
        timeout_s: collective timeout; defaults to `cfg.timeout_s`.

    Returns:
        The context holding rank info, devices and the process groups.
    """
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", 1)
    backend, device = pick_backend_and_device(cfg, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    comm_device = device if backend == "nccl" else torch.device("cpu")
    me = RankPlace(node=_socket.gethostname(), socket=detect_socket(device.type, device.index))

    if world == 1:
        places = emulated_places(1, 1) if cfg.intra_group_size else [me]
        return DistContext(
            rank=0, world_size=1, local_rank=local_rank, local_world_size=local_world, backend="none",
            device=device, comm_device=comm_device, places=places, topology=two_phase_groups(places),
        )

    timeout = _dt.timedelta(seconds=timeout_s if timeout_s is not None else cfg.timeout_s)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    # torchrun keeps its store across worker restarts (trainer.max_restarts): without a per-attempt prefix
    # a restarted rank can read a dead rank's address left by the previous attempt and fail to connect
    store, _, _ = next(dist.rendezvous("env://", rank, world, timeout=timeout))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"ctrpipe/attempt-{attempt}", store)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world, timeout=timeout, **kwargs)
    ctx = DistContext(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world, backend=backend,
        device=device, comm_device=comm_device, places=[], topology=two_phase_groups([me]), initialized_pg=True,
    )
    try:
        if cfg.intra_group_size:
            places = emulated_places(world, cfg.intra_group_size)
        else:
            gathered: list[RankPlace | None] = [None] * world
            dist.all_gather_object(gathered, me)
            places = [p for p in gathered if p is not None]
        topo = two_phase_groups(places)
        ctx.places, ctx.topology = places, topo
        # every rank must call new_group for every group, in the same order
        for g in topo.groups:
            if len(g) > 1:
                pg = dist.new_group(list(g))
                if rank in g:
                    ctx.intra_group = pg
        if len(topo.leaders) > 1:
            pg = dist.new_group(list(topo.leaders))
            if rank in topo.leaders:
                ctx.leader_group = pg
    except BaseException:
        ctx.destroy()
        raise
    return ctx


# ----------------------------------------------------------------------------- dense allreduce


def _flatten(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ValueError(f"all-reduced tensors must share one dtype, got {sorted(map(str, dtypes))}")
    return torch.cat([t.detach().reshape(-1).to(device) for t in tensors])  # (sum numel,)


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def _check_op(op: str) -> None:
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")


def hierarchical_all_reduce(tensors: Sequence[torch.Tensor], ctx: DistContext, *, op: str = "avg") -> int:
    """Two-phase allreduce of `tensors` in place: reduce to group leaders, allreduce among them, broadcast back.

    The tensors are flattened into one buffer so each phase is one collective.

    Args:
        tensors: same-dtype tensors, identical shapes on every rank; overwritten with the result.
        ctx: the context holding the phase-1 and phase-2 groups.
        op: `avg` (mean over all ranks) or `sum`.

    Returns:
        Bytes of the buffer this rank sent through collectives (0 with one rank).
    """
    _check_op(op)
    if ctx.world_size == 1 or not tensors:
        return 0
    flat = _flatten(tensors, ctx.comm_device)
    leader = ctx.leader
    if ctx.intra_group is not None:  # phase 1: fast links inside the node/socket
        dist.reduce(flat, dst=leader, op=dist.ReduceOp.SUM, group=ctx.intra_group)
    if ctx.leader_group is not None:  # phase 2: one leader per group over the slow links
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=ctx.leader_group)
    if ctx.intra_group is not None:  # phase 3: result back to the group
        dist.broadcast(flat, src=leader, group=ctx.intra_group)
    if op == "avg":
        flat /= ctx.world_size
    _unflatten_into(flat, tensors)
    return flat.numel() * flat.element_size()


def flat_all_reduce(tensors: Sequence[torch.Tensor], ctx: DistContext, *, op: str = "avg") -> int:
    """Topology-unaware allreduce of `tensors` in place over the whole world (the reference).

    Returns:
        Bytes of the buffer reduced (0 with one rank).
    """
    _check_op(op)
    if ctx.world_size == 1 or not tensors:
        return 0
    flat = _flatten(tensors, ctx.comm_device)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    if op == "avg":
        flat /= ctx.world_size
    _unflatten_into(flat, tensors)
    return flat.numel() * flat.element_size()


def broadcast_tensors(tensors: Sequence[torch.Tensor], ctx: DistContext, *, src: int = 0) -> None:
    """Overwrite `tensors` on every rank with rank `src`'s values (one flattened broadcast)."""
    if ctx.world_size == 1 or not tensors:
        return
    flat = _flatten(tensors, ctx.comm_device)
    dist.broadcast(flat, src=src)
    _unflatten_into(flat, tensors)


# ----------------------------------------------------------------------------- sparse all-to-all


@dataclass(frozen=True)
class Route:
    """How a rank's deduplicated keys travel to their owners.

    Attributes:
        unique: sorted distinct keys (U,).
        inverse: index into `unique` of every original key (N,).
        order: permutation of `unique` grouping keys by owner rank (U,).
        send_counts: keys sent to each rank, in rank order (world,).
    """

    unique: torch.Tensor
    inverse: torch.Tensor
    order: torch.Tensor
    send_counts: list[int]


def route_keys(keys: torch.Tensor, world_size: int) -> Route:
    """Deduplicate `keys` (N,) and order the distinct keys by owner (`owner_of(key, world)`)."""
    unique, inverse = torch.unique(keys, return_inverse=True)  # (U,), (N,)
    owners = owner_of(unique, world_size)  # (U,)
    order = torch.argsort(owners, stable=True)
    counts = torch.bincount(owners, minlength=world_size)
    return Route(unique=unique, inverse=inverse, order=order, send_counts=counts.tolist())


def exchange_counts(send_counts: list[int], ctx: DistContext) -> list[int]:
    """All-to-all of per-rank counts: returns how many items each rank will send to this one."""
    if ctx.world_size == 1:
        return list(send_counts)
    send = torch.tensor(send_counts, dtype=torch.int64, device=ctx.comm_device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return recv.tolist()


def all_to_all_rows(
    tensor: torch.Tensor, send_counts: list[int], recv_counts: list[int], ctx: DistContext
) -> torch.Tensor:
    """All-to-all with uneven splits along dim 0: rows [sum(send[:r]), +send[r]) go to rank r.

    Args:
        tensor: (sum(send_counts), ...) already grouped by destination rank.
        send_counts / recv_counts: rows to each / from each rank (from `exchange_counts`).

    Returns:
        (sum(recv_counts), ...) on `ctx.comm_device`, grouped by source rank.
    """
    if ctx.world_size == 1:
        return tensor
    inp = tensor.to(ctx.comm_device).contiguous()
    out = torch.empty((sum(recv_counts), *inp.shape[1:]), dtype=inp.dtype, device=ctx.comm_device)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    return out


def exchange_keys(keys: torch.Tensor, ctx: DistContext) -> tuple[Route, torch.Tensor, list[int]]:
    """Send each distinct key of `keys` to its owner.

    Returns:
        (route, keys this rank owns and must serve (M,), recv_counts per source rank).
    """
    route = route_keys(keys.reshape(-1), ctx.world_size)
    recv_counts = exchange_counts(route.send_counts, ctx)
    owned = all_to_all_rows(route.unique[route.order], route.send_counts, recv_counts, ctx)
    return route, owned, recv_counts


def exchange_rows(rows: torch.Tensor, route: Route, recv_counts: list[int], ctx: DistContext) -> torch.Tensor:
    """Return owners' rows (M, D) (in the order the keys arrived) to the requesters; (U, D) in `route.unique` order."""
    back = all_to_all_rows(rows, recv_counts, route.send_counts, ctx)  # (U, D) grouped by owner
    out = torch.empty_like(back)
    out[route.order.to(back.device)] = back
    return out


def _send_grads(
    keys: torch.Tensor, grads: torch.Tensor, ctx: DistContext
) -> tuple[torch.Tensor, torch.Tensor, int]:
    route = route_keys(keys.reshape(-1), ctx.world_size)
    grads = grads.reshape(route.inverse.numel(), grads.shape[-1])  # (N, D), N may be 0
    summed = torch.zeros((route.unique.numel(), grads.shape[1]), dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, route.inverse.to(grads.device), grads)  # (U, D)
    recv_counts = exchange_counts(route.send_counts, ctx)
    owned = all_to_all_rows(route.unique[route.order], route.send_counts, recv_counts, ctx)
    owned_grads = all_to_all_rows(summed[route.order.to(summed.device)], route.send_counts, recv_counts, ctx)
    sent = route.unique.numel() * route.unique.element_size() + summed.numel() * summed.element_size()
    return owned, owned_grads, sent


def return_grads(keys: torch.Tensor, grads: torch.Tensor, ctx: DistContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the gradients (N, D) of duplicate keys (N,) locally and send them to the owners.

    Returns:
        (keys this rank owns (M,), their gradients (M, D)); a key may appear once per sender.
    """
    owned, owned_grads, _ = _send_grads(keys, grads, ctx)
    return owned, owned_grads


class ShardedEmbedding:
    """The model-parallel embedding table: rank r's `store` holds the keys with `owner_of(key, world) == r`.

    `pull` fetches rows for any keys from their owners (all-to-all of counts,
    then keys, then rows); `push` sends row gradients back to the owners, which
    apply sparse Adam.  Both are collectives: every rank must call them in the
    same order (a rank with no keys passes an empty tensor), pull then push,
    once per step.

    With `staleness_bound > 0` (and more than one rank) remote rows go through
    a `trainer.staleness.StaleRowCache`: a copy serves `staleness_bound` steps
    after the one that fetched it, its gradients are summed locally and pushed
    when it expires or is evicted.  `flush()` pushes every pending gradient
    (a collective; call it on every rank before reading or snapshotting the
    store).  With bound 0 the synchronous path runs unchanged.

    Args:
        store: this rank's shard of the table.
        ctx: the distributed context.
        lr: sparse-Adam learning rate of the rows.
        weight_decay: passed to `store.update`.
        staleness_bound: HET bound in steps (0 = synchronous).
        cache_rows: capacity of the cache of remote rows.
        use_cache: force the cache path on or off (default: on when the bound is > 0 and world > 1);
            the cache path with bound 0 computes bit-for-bit what the synchronous path does.

    Example::

        emb = ShardedEmbedding(store, ctx, lr=1e-2)
        rows = emb.pull(keys.reshape(-1)).view(B, F, D).requires_grad_()
        ...loss.backward()...
        emb.push(keys.reshape(-1), rows.grad.reshape(-1, D))
    """

    def __init__(
        self,
        store: EmbeddingStore,
        ctx: DistContext,
        *,
        lr: float,
        weight_decay: float = 0.0,
        staleness_bound: int = 0,
        cache_rows: int = 1_000_000,
        use_cache: bool | None = None,
    ) -> None:
        self.store, self.ctx = store, ctx
        self.dim = store.dim
        self.lr, self.weight_decay = lr, weight_decay
        self.bytes_sent = 0
        self.bytes_received = 0
        self.seconds = 0.0
        self.steps = 0
        """Pushes done (the cache's clock)."""
        if use_cache is None:
            use_cache = staleness_bound > 0 and ctx.world_size > 1
        self.cache = StaleRowCache(store.dim, bound=staleness_bound, capacity=cache_rows) if use_cache else None
        self._pulled: torch.Tensor | None = None

    def _to_store(self, t: torch.Tensor) -> torch.Tensor:
        device = getattr(self.store, "device", None)
        return t if device is None else t.to(device)

    def pull(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of `keys` (N,) as float32 (N, D) on `ctx.device`, in the order of `keys`."""
        t0 = time.perf_counter()
        keys = keys.reshape(-1).to(torch.int64).cpu()
        if self.cache is not None:
            out = self._pull_cached(keys)
            self.seconds += time.perf_counter() - t0
            return out
        route, owned, recv_counts = exchange_keys(keys, self.ctx)
        served = self.store.lookup(self._to_store(owned))  # (M, D) rows this rank owns, for the requesters
        rows = exchange_rows(served, route, recv_counts, self.ctx)  # (U, D)
        if self.ctx.world_size > 1:
            self.bytes_sent += route.unique.numel() * 8 + served.numel() * served.element_size()
            self.bytes_received += owned.numel() * 8 + rows.numel() * rows.element_size()
        out = rows.to(self.ctx.device)[route.inverse.to(self.ctx.device)]  # (N, D)
        self.seconds += time.perf_counter() - t0
        return out

    def push(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """Apply `grads` (N, D) of `keys` (N,) on their owners (duplicates summed, one Adam step per row)."""
        t0 = time.perf_counter()
        keys = keys.reshape(-1).to(torch.int64).cpu()
        grads = grads.detach().reshape(keys.numel(), self.dim)
        if self.cache is not None:
            keys, grads = self._stage_cached(keys, grads)
        self._send(keys, grads)
        self.steps += 1
        self.seconds += time.perf_counter() - t0

    def flush(self) -> None:
        """Push every gradient the cache still holds and empty it (a collective; no-op without a cache)."""
        if self.cache is None:
            return
        t0 = time.perf_counter()
        self.cache.drain()
        self._send(*self.cache.take_outgoing())
        self.seconds += time.perf_counter() - t0

    def _pull_cached(self, keys: torch.Tensor) -> torch.Tensor:
        assert self.cache is not None
        unique, inverse = torch.unique(keys, return_inverse=True)  # (U,), (N,)
        remote = owner_of(unique, self.ctx.world_size) != self.ctx.rank
        hit, hit_rows = self.cache.lookup(unique, remote)  # only remote keys are ever cached
        need = unique[~hit]  # sorted, distinct
        route, owned, recv_counts = exchange_keys(need, self.ctx)
        served = self.store.lookup(self._to_store(owned))  # (M, D)
        fetched = exchange_rows(served, route, recv_counts, self.ctx).cpu()  # (len(need), D), order of `need`
        if self.ctx.world_size > 1:
            self.bytes_sent += need.numel() * 8 + served.numel() * served.element_size()
            self.bytes_received += owned.numel() * 8 + fetched.numel() * fetched.element_size()
        fetch_remote = remote[~hit]
        self.cache.insert(need[fetch_remote], fetched[fetch_remote], step=self.steps)
        rows = torch.empty((unique.numel(), self.dim), dtype=fetched.dtype)
        rows[hit] = hit_rows.to(rows.dtype)
        rows[~hit] = fetched
        return rows.to(self.ctx.device)[inverse.to(self.ctx.device)]  # (N, D)

    def _stage_cached(self, keys: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sum `grads` per key, keep the cached copies' share, and return what must be sent this step."""
        assert self.cache is not None
        unique, inverse = torch.unique(keys, return_inverse=True)
        summed = torch.zeros((unique.numel(), self.dim), dtype=grads.dtype, device=grads.device)
        summed.index_add_(0, inverse.to(grads.device), grads)  # (U, D), as `_send_grads` sums them
        cached = self.cache.accumulate(unique, summed)
        self.cache.expire(self.steps)
        out_keys, out_grads = self.cache.take_outgoing()
        direct = ~cached
        return (
            torch.cat([unique[direct], out_keys]),
            torch.cat([summed[direct.to(summed.device)].cpu(), out_grads.to(summed.dtype)]),
        )

    def _send(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        owned, owned_grads, sent = _send_grads(keys, grads, self.ctx)
        if self.ctx.world_size > 1:
            self.bytes_sent += sent
            self.bytes_received += owned.numel() * 8 + owned_grads.numel() * owned_grads.element_size()
        if owned.numel():
            self.store.update(
                self._to_store(owned), self._to_store(owned_grads), lr=self.lr, weight_decay=self.weight_decay
            )

    @property
    def sparse_bytes(self) -> int:
        return self.bytes_sent + self.bytes_received
