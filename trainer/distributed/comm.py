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
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist

from storage.embedding.base import EmbeddingStore, Lookup, owner_of
from trainer.config import TrainerConfig
from trainer.distributed.staleness import StaleRowCache
from trainer.distributed.topology import (
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


def unique_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.unique(keys, return_inverse=True)` of 1-D int64 keys: sorted distinct keys (U,), inverse (N,).

    On CPU a hash table (`pandas.factorize`) finds the distinct keys and only those U are sorted,
    instead of sorting all N: ~3x faster on a step's keys (26 fields x 1024 rows, ~4k distinct),
    and every step routes its keys.  Same result, bit for bit.
    """
    if keys.device.type != "cpu" or keys.dtype != torch.int64:
        return torch.unique(keys, return_inverse=True)
    codes, uniq = pd.factorize(keys.numpy(), sort=True)
    return torch.from_numpy(np.asarray(uniq, dtype=np.int64)), torch.from_numpy(codes.astype(np.int64, copy=False))


def route_keys(keys: torch.Tensor, world_size: int) -> Route:
    """Deduplicate `keys` (N,) and order the distinct keys by owner (`owner_of(key, world)`)."""
    unique, inverse = unique_keys(keys)  # (U,), (N,)
    if world_size == 1:  # one owner: the order is the identity and nothing needs grouping
        return Route(unique=unique, inverse=inverse, order=torch.arange(unique.numel()), send_counts=[unique.numel()])
    owners = owner_of(unique, world_size)  # (U,)
    order = torch.argsort(owners, stable=True)
    counts = torch.bincount(owners, minlength=world_size)
    return Route(unique=unique, inverse=inverse, order=order, send_counts=counts.tolist())


def _by_owner(t: torch.Tensor, route: Route, world_size: int) -> torch.Tensor:
    """`t` (U, ...) in `route.unique` order -> grouped by owner (`t[route.order]`; `t` itself with one rank)."""
    return t if world_size == 1 else t.index_select(0, route.order.to(t.device))


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
    owned = all_to_all_rows(_by_owner(route.unique, route, ctx.world_size), route.send_counts, recv_counts, ctx)
    return route, owned, recv_counts


def exchange_rows(rows: torch.Tensor, route: Route, recv_counts: list[int], ctx: DistContext) -> torch.Tensor:
    """Return owners' rows (M, D) (in the order the keys arrived) to the requesters; (U, D) in `route.unique` order."""
    back = all_to_all_rows(rows, recv_counts, route.send_counts, ctx)  # (U, D) grouped by owner
    if ctx.world_size == 1:  # the route's order is the identity
        return back
    return torch.empty_like(back).index_copy_(0, route.order.to(back.device), back)


def _send_grads(
    keys: torch.Tensor, grads: torch.Tensor, ctx: DistContext, counts: torch.Tensor | None = None,
    route: Route | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, int]]:
    """Sum the gradients (and `counts`) of duplicate keys and send them to the owners.

    Args:
        route: `route_keys(keys)` when the caller has it already (the pull of the same keys).

    Returns:
        (keys this rank owns (M,), their gradients (M, D), their counts (M,) or None,
        (bytes sent to, bytes received from) the other ranks).
    """
    if route is None:
        route = route_keys(keys.reshape(-1), ctx.world_size)
    grads = grads.reshape(route.inverse.numel(), grads.shape[-1])  # (N, D), N may be 0
    D = grads.shape[1]
    if counts is not None:  # the update counts ride as one more float32 column (exact below 2^24)
        grads = torch.cat([grads, counts.reshape(-1, 1).to(grads)], dim=1)  # (N, D + 1)
    summed = torch.zeros((route.unique.numel(), grads.shape[1]), dtype=grads.dtype, device=grads.device)
    summed.index_add_(0, route.inverse.to(grads.device), grads)  # (U, D[+1])
    recv_counts = exchange_counts(route.send_counts, ctx)
    owned = all_to_all_rows(_by_owner(route.unique, route, ctx.world_size), route.send_counts, recv_counts, ctx)
    owned_grads = all_to_all_rows(_by_owner(summed, route, ctx.world_size), route.send_counts, recv_counts, ctx)
    row_b = 8 + summed.shape[1] * summed.element_size()  # key + gradient (+ count) of one row
    me = ctx.rank
    wire = (row_b * (sum(route.send_counts) - route.send_counts[me]), row_b * (sum(recv_counts) - recv_counts[me]))
    if counts is None:
        return owned, owned_grads, None, wire
    return owned, owned_grads[:, :D], owned_grads[:, D].round().to(torch.int64), wire


def return_grads(keys: torch.Tensor, grads: torch.Tensor, ctx: DistContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the gradients (N, D) of duplicate keys (N,) locally and send them to the owners.

    Returns:
        (keys this rank owns (M,), their gradients (M, D)); a key may appear once per sender.
    """
    owned, owned_grads, _, _ = _send_grads(keys, grads, ctx)
    return owned, owned_grads


def apply_updates(
    store: EmbeddingStore, target: torch.Tensor | Lookup, grads: torch.Tensor, counts: torch.Tensor | None, *,
    lr: float, weight_decay: float = 0.0,
) -> None:
    """Apply gradients that arrived at the owner: entry i is the sum of `counts[i]` updates (None = 1 each).

    A sum G of L updates is applied as L sparse-Adam steps on G / L, so a row
    that a HET cache held back for L steps moves as far as L synchronous steps
    would have moved it (one Adam step on G would move it about L times less:
    Adam's step does not grow with the gradient), and its clock advances by L.
    Round j applies every entry with L > j; entries of one key from several
    senders are summed within a round (one step per row per round).  With all
    counts 1 this is exactly one `store.update`, the synchronous rule.
    """
    if counts is None or not counts.numel() or bool((counts == 1).all()):
        store.update(target, grads, lr=lr, weight_decay=weight_decay)
        return
    keys = target.keys if isinstance(target, Lookup) else target
    c = counts.to(grads.device)
    mean = grads / c.to(grads.dtype)[:, None]
    for j in range(int(c.max())):
        sel = c > j
        store.update(keys[sel.to(keys.device)], mean[sel], lr=lr, weight_decay=weight_decay)


def _split_by_owner(keys: torch.Tensor, world: int) -> tuple[torch.Tensor, list[int]]:
    """(permutation grouping `keys` by owner rank, count per rank)."""
    owners = owner_of(keys, world)
    return torch.argsort(owners, stable=True), torch.bincount(owners, minlength=world).tolist()


def _segments(counts: list[int]) -> list[tuple[int, int]]:
    out, lo = [], 0
    for n in counts:
        out.append((lo, lo + n))
        lo += n
    return out


@dataclass(frozen=True)
class CachedPull:
    """What `pull_with_clocks` brings back, in the order of the keys asked for.

    Attributes:
        need_rows: (len(need), D) rows of the keys that were not cached.
        need_clocks: (len(need),) their owners' clocks.
        check_clocks: (len(check),) the owners' clocks of the cached keys.
        stale: (len(check),) bool: the cached keys whose clock passed their threshold.
        stale_rows: (stale.sum(), D) fresh rows of those keys.
        nbytes: (bytes sent to, bytes received from) the other ranks, by kind (`pull_keys`, `pull_rows`, `clock`).
    """

    need_rows: torch.Tensor
    need_clocks: torch.Tensor
    check_clocks: torch.Tensor
    stale: torch.Tensor
    stale_rows: torch.Tensor
    nbytes: dict[str, tuple[int, int]]


def pull_with_clocks(
    store: EmbeddingStore, need: torch.Tensor, check: torch.Tensor, threshold: torch.Tensor, ctx: DistContext
) -> CachedPull:
    """The HET pull: rows + clocks of `need`, clocks of `check`, and rows of the `check` keys grown stale.

    A cached key k is sent with its threshold (the largest owner clock at
    which the copy is still valid); the owner returns its clock, and its row
    only when the clock passed the threshold.  Both sides know from the clocks
    which rows follow, so four collectives do it: counts, keys (+ thresholds),
    clocks, rows.  A collective: every rank calls it (with empty tensors when
    it has nothing to ask).

    Args:
        store: this rank's shard (its `read_rows` reports the row clocks).
        need, check: distinct keys (N,), (C,); `threshold` (C,) int64 for `check`.
    """
    W = ctx.world_size
    dev = ctx.comm_device
    i64 = torch.int64
    order_n, m = _split_by_owner(need, W)
    order_c, c = _split_by_owner(check, W)
    need_s, check_s, thr_s = need[order_n], check[order_c], threshold.to(i64)[order_c]
    send_counts = torch.tensor([m, c], dtype=i64).T.reshape(-1)  # (W * 2,): [m_0, c_0, m_1, c_1, ...]
    if W == 1:
        recv = send_counts
    else:
        send_counts = send_counts.to(dev)
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv, send_counts)
    rm, rc = recv.view(W, 2)[:, 0].tolist(), recv.view(W, 2)[:, 1].tolist()

    # 1) keys: to owner r, [its misses, its cached keys, their thresholds]
    seg_n, seg_c = _segments(m), _segments(c)
    payload = torch.cat([
        torch.cat([need_s[a:b], check_s[x:y], thr_s[x:y]]) for (a, b), (x, y) in zip(seg_n, seg_c, strict=True)
    ])
    got = all_to_all_rows(payload, [mi + 2 * ci for mi, ci in zip(m, c, strict=True)],
                          [mi + 2 * ci for mi, ci in zip(rm, rc, strict=True)], ctx).cpu()

    # 2) the owner: clocks of every key asked, rows of the misses and of the stale cached keys
    parts_keys, parts_thr, lo = [], [], 0
    for mi, ci in zip(rm, rc, strict=True):
        parts_keys += [got[lo : lo + mi + ci]]
        parts_thr += [torch.cat([torch.full((mi,), -1, dtype=i64), got[lo + mi + ci : lo + mi + 2 * ci]])]
        lo += mi + 2 * ci
    asked = torch.cat(parts_keys) if parts_keys else torch.empty(0, dtype=i64)
    asked_thr = torch.cat(parts_thr) if parts_thr else torch.empty(0, dtype=i64)
    uniq, inv = unique_keys(asked)
    _, rows = store.read_rows(uniq.numpy())
    clocks = rows.clock.cpu()[inv]  # (A,)
    send_row = clocks > asked_thr  # misses (threshold -1) always
    served = rows.emb.to(dev)[inv.to(dev)][send_row.to(dev)]  # (R, D) grouped by requester
    sizes_clk = [mi + ci for mi, ci in zip(rm, rc, strict=True)]
    sizes_rows, lo = [], 0
    for n in sizes_clk:
        sizes_rows.append(int(send_row[lo : lo + n].sum()))
        lo += n

    # 3) clocks back; the requester works out which rows follow
    back_clk = all_to_all_rows(clocks.to(dev), sizes_clk, [mi + ci for mi, ci in zip(m, c, strict=True)], ctx).cpu()
    clk_need_s, clk_check_s = [], []
    lo = 0
    for mi, ci in zip(m, c, strict=True):
        clk_need_s.append(back_clk[lo : lo + mi])
        clk_check_s.append(back_clk[lo + mi : lo + mi + ci])
        lo += mi + ci
    clk_need_s_t = torch.cat(clk_need_s) if clk_need_s else torch.empty(0, dtype=i64)
    clk_check_s_t = torch.cat(clk_check_s) if clk_check_s else torch.empty(0, dtype=i64)
    stale_s = clk_check_s_t > thr_s
    recv_rows = [mi + int(stale_s[x:y].sum()) for mi, (x, y) in zip(m, seg_c, strict=True)]

    # 4) rows back: from owner r, [its misses' rows, its stale cached keys' rows]
    back = all_to_all_rows(served, sizes_rows, recv_rows, ctx).cpu()
    need_rows_s, stale_rows_s, lo = [], [], 0
    for mi, n in zip(m, recv_rows, strict=True):
        need_rows_s.append(back[lo : lo + mi])
        stale_rows_s.append(back[lo + mi : lo + n])
        lo += n
    D = store.dim
    need_rows = torch.empty((need.numel(), D), dtype=back.dtype)
    need_rows[order_n] = torch.cat(need_rows_s) if need_rows_s else torch.empty(0, D)
    need_clocks = torch.empty(need.numel(), dtype=i64)
    need_clocks[order_n] = clk_need_s_t
    check_clocks = torch.empty(check.numel(), dtype=i64)
    check_clocks[order_c] = clk_check_s_t
    stale = torch.empty(check.numel(), dtype=torch.bool)
    stale[order_c] = stale_s
    # stale rows arrive grouped by owner, in `check_s` order: put them in `check` order
    stale_rows_sorted = torch.cat(stale_rows_s) if stale_rows_s else torch.empty(0, D)
    stale_rows = stale_rows_sorted[torch.argsort(order_c[stale_s])]  # (S, D) in `check` order

    row_b = D * back.element_size()
    def wire(counts: list[int]) -> int:  # items exchanged with the other ranks (this rank's own stay here)
        return sum(counts) - counts[ctx.rank]

    own_clk = [mi + ci for mi, ci in zip(m, c, strict=True)]
    nbytes = {  # (sent, received)
        "pull_keys": (8 * wire(m), 8 * wire(rm)),
        "clock": (16 * wire(c) + 8 * wire(sizes_clk), 16 * wire(rc) + 8 * wire(own_clk)),
        "pull_rows": (row_b * wire(sizes_rows), row_b * wire(recv_rows)),
    }
    return CachedPull(need_rows, need_clocks, check_clocks, stale, stale_rows, nbytes)


@dataclass(frozen=True)
class _Pulled:
    """The route of the last synchronous pull, for a push of the same keys (the usual step).

    The push then neither de-duplicates nor routes the keys again, and hands the owner's store
    the very tensor of owned keys the pull looked up, so a store that remembers its last lookup
    (`storage.embedding.cache.CachingTier`) does not resolve them a second time either.  The collectives
    are unchanged, so ranks that reuse and ranks that do not still exchange the same messages.
    """

    keys: torch.Tensor
    """The caller's tensor (identity and in-place version are checked)."""
    version: int
    route: Route
    owned: torch.Tensor
    """The keys this rank served (M,), as given to its store."""
    lookup: Lookup
    """The store's lookup of `owned`, handed back to its `update`."""

    def matches(self, keys: torch.Tensor) -> bool:
        return keys is self.keys and keys._version == self.version


class ShardedEmbedding:
    """The model-parallel embedding table: rank r's `store` holds the keys with `owner_of(key, world) == r`.

    `pull` fetches rows for any keys from their owners (all-to-all of counts,
    then keys, then rows); `push` sends row gradients back to the owners, which
    apply sparse Adam.  Both are collectives: every rank must call them in the
    same order (a rank with no keys passes an empty tensor), pull then push,
    once per step.

    With `staleness_bound > 0` (and more than one rank) remote rows go through
    a `trainer.distributed.staleness.StaleRowCache` (HET, per-row clocks): a cached copy is
    checked against its owner's clock at each pull that needs it and served
    while it misses at most `staleness_bound` updates; the rank applies its
    own gradients to the copy and sums them, and pushes the sum when the bound
    would be crossed or the copy is evicted.  `flush()` pushes every pending
    gradient (a collective; call it on every rank before reading or
    snapshotting the store).  With bound 0 the synchronous path runs unchanged.

    Bytes moved between ranks (sent + received by this rank; the rows of keys
    a rank owns itself never leave it and are not counted) are counted by kind in
    `bytes_by_kind`: `pull_keys`, `pull_rows`, `push` (keys, gradients and,
    with the cache, update counts) and `clock` (the cache's clock checks).
    `uncached_bytes` counts what the synchronous path would have moved for the
    same keys (summed over ranks it equals the synchronous run's `sparse_bytes`).

    Args:
        store: this rank's shard of the table.
        ctx: the distributed context.
        lr: sparse-Adam learning rate of the rows.
        weight_decay: passed to `store.update`.
        staleness_bound: HET bound in row updates (0 = synchronous).
        cache_rows: capacity of the cache of remote rows.
        use_cache: force the cache path on or off (default: on when the bound is > 0 and world > 1);
            the cache path with bound 0 computes bit-for-bit what the synchronous path does.

    Example::

        emb = ShardedEmbedding(store, ctx, lr=1e-2)
        flat = keys.reshape(-1)
        rows = emb.pull(flat).view(B, F, D).requires_grad_()
        ...loss.backward()...
        emb.push(flat, rows.grad.reshape(-1, D))  # the pulled tensor itself: its routing is reused
    """

    KINDS = ("pull_keys", "pull_rows", "push", "clock")

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
        self.bytes_by_kind = dict.fromkeys(self.KINDS, 0)
        self.uncached_bytes = 0
        self.seconds = 0.0
        self.steps = 0
        """Pushes done (the step the next pull belongs to)."""
        if use_cache is None:
            use_cache = staleness_bound > 0 and ctx.world_size > 1
        self.cache = StaleRowCache(store.dim, bound=staleness_bound, capacity=cache_rows) if use_cache else None
        self._pulled: _Pulled | None = None

    def _to_store(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.store.device)

    def _count(self, kind: str, sent: int, received: int) -> None:
        if self.ctx.world_size > 1:
            self.bytes_sent += sent
            self.bytes_received += received
            self.bytes_by_kind[kind] += sent + received

    def pull(self, keys: torch.Tensor) -> torch.Tensor:
        """Rows of `keys` (N,) as float32 (N, D) on `ctx.device`, in the order of `keys`."""
        t0 = time.perf_counter()
        given, self._pulled = keys, None
        keys = keys.reshape(-1).to(torch.int64).cpu()
        if self.cache is not None:
            out = self._pull_cached(keys)
            self.seconds += time.perf_counter() - t0
            return out
        route, owned, recv_counts = exchange_keys(keys, self.ctx)
        owned = self._to_store(owned)
        looked = self.store.lookup(owned)
        served = looked.rows  # (M, D) rows this rank owns, for the requesters
        rows = exchange_rows(served, route, recv_counts, self.ctx)  # (U, D)
        me, row_b = self.ctx.rank, self.dim * served.element_size()
        asked, got = sum(route.send_counts) - route.send_counts[me], sum(recv_counts) - recv_counts[me]
        self._count("pull_keys", 8 * asked, 8 * got)
        self._count("pull_rows", row_b * got, row_b * asked)
        out = rows.to(self.ctx.device).index_select(0, route.inverse.to(self.ctx.device))  # (N, D)
        self._pulled = _Pulled(given, given._version, route, owned, looked)
        self.seconds += time.perf_counter() - t0
        return out

    def push(self, keys: torch.Tensor, grads: torch.Tensor) -> None:
        """Apply `grads` (N, D) of `keys` (N,) on their owners (duplicates summed, one Adam step per row).

        Passing the very tensor given to the last `pull` (not changed in place since) reuses that
        pull's routing of the keys (`_Pulled`); any other keys are routed afresh.
        """
        t0 = time.perf_counter()
        pulled, self._pulled = self._pulled, None
        given = keys
        keys = keys.reshape(-1).to(torch.int64).cpu()
        grads = grads.detach().reshape(keys.numel(), self.dim)
        if self.cache is not None:
            self._send(*self._stage_cached(keys, grads))
        else:
            self._send(keys, grads, pulled=pulled if pulled is not None and pulled.matches(given) else None)
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
        cache = self.cache
        unique, inverse = unique_keys(keys)  # (U,), (N,)
        cached, pos = cache.find(unique)  # only remote keys are ever cached
        check, need = unique[cached], unique[~cached]
        # the largest owner clock at which a copy is still valid: clock - base + local <= bound
        threshold = cache.base[pos[cached]] - cache.local[pos[cached]] + cache.bound
        got = pull_with_clocks(self.store, need, check, threshold, self.ctx)
        for kind, (sent, received) in got.nbytes.items():
            self._count(kind, sent, received)
        valid, hit_rows = cache.serve(check, got.check_clocks, step=self.steps)
        if not torch.equal(valid, ~got.stale):
            raise RuntimeError("HET cache and owners disagree on which copies are stale (internal error)")
        rows = torch.empty((unique.numel(), self.dim), dtype=torch.float32)
        rows[~cached] = got.need_rows.to(rows.dtype)
        idx_check = torch.nonzero(cached).reshape(-1)
        rows[idx_check[valid]] = hit_rows
        rows[idx_check[~valid]] = got.stale_rows.to(rows.dtype)
        # cache the fresh copies of remote keys (stale ones included: refetched with their new clocks)
        remote = owner_of(unique, self.ctx.world_size) != self.ctx.rank
        fresh = ~cached & remote
        fresh_rows = torch.cat([got.need_rows[remote[~cached]], got.stale_rows])
        fresh_clocks = torch.cat([got.need_clocks[remote[~cached]], got.check_clocks[~valid]])
        cache.insert(torch.cat([unique[fresh], check[~valid]]), fresh_rows, fresh_clocks, step=self.steps)
        return rows.to(self.ctx.device)[inverse.to(self.ctx.device)]  # (N, D)

    def _stage_cached(
        self, keys: torch.Tensor, grads: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sum `grads` per key, keep the cached copies' share, and return what must be sent this step."""
        assert self.cache is not None
        unique, inverse = unique_keys(keys)
        summed = torch.zeros((unique.numel(), self.dim), dtype=grads.dtype, device=grads.device)
        summed.index_add_(0, inverse.to(grads.device), grads)  # (U, D), as `_send_grads` sums them
        # what the synchronous path moves for these keys: key + row at the pull, key + gradient at the push
        # of every remote key, each counted once sent and once received
        remote = int((owner_of(unique, self.ctx.world_size) != self.ctx.rank).sum())
        self.uncached_bytes += 2 * remote * (16 + 2 * self.dim * summed.element_size())
        cached = self.cache.accumulate(unique, summed, lr=self.lr, weight_decay=self.weight_decay)
        self.cache.expire(self.steps)
        out_keys, out_grads, out_counts = self.cache.take_outgoing()
        direct = ~cached
        return (
            torch.cat([unique[direct], out_keys]),
            torch.cat([summed[direct.to(summed.device)].cpu(), out_grads.to(summed.dtype)]),
            torch.cat([torch.ones(int(direct.sum()), dtype=torch.int64), out_counts]),
        )

    def _send(
        self, keys: torch.Tensor, grads: torch.Tensor, counts: torch.Tensor | None = None, *,
        pulled: _Pulled | None = None,
    ) -> None:
        route = pulled.route if pulled is not None else None
        owned, owned_grads, owned_counts, (sent, received) = _send_grads(keys, grads, self.ctx, counts, route=route)
        self._count("push", sent, received)
        target: torch.Tensor | Lookup = self._to_store(owned)
        if pulled is not None and owned.shape == pulled.owned.shape and torch.equal(owned, pulled.owned.to(owned)):
            target = pulled.lookup  # the store's own lookup of these keys at the pull: it may reuse what it resolved
        if owned.numel():
            apply_updates(
                self.store, target, self._to_store(owned_grads),
                None if owned_counts is None else self._to_store(owned_counts),
                lr=self.lr, weight_decay=self.weight_decay,
            )

    @property
    def sparse_bytes(self) -> int:
        return self.bytes_sent + self.bytes_received

    def comm_stats(self) -> dict[str, Any]:
        """This rank's sparse-communication counters (for model.json): bytes by kind, the uncached
        equivalent (0 without a cache) and the cache's counters (None without a cache)."""
        return {
            "sparse_bytes": self.sparse_bytes, "bytes_by_kind": dict(self.bytes_by_kind),
            "uncached_bytes": self.uncached_bytes if self.cache is not None else self.sparse_bytes,
            "cache": self.cache.stats() if self.cache is not None else None,
        }
