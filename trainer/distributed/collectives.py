"""Collectives on dense tensors: the two-phase allreduce, its flat reference, broadcast, and the
uneven all-to-all that the sparse exchange is built on.

Every function takes the `DistContext` whose groups it uses and returns at once with one rank.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from storage.embedding.rows.transfer import host_to_device
from trainer.distributed.context import DistContext

OPS = ("avg", "sum")


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


def exchange_counts(send_counts: list[int], ctx: DistContext) -> list[int]:
    """All-to-all of per-rank counts: returns how many items each rank will send to this one."""
    if ctx.world_size == 1:
        return list(send_counts)
    send = torch.tensor(send_counts, dtype=torch.int64, device=ctx.comm_device)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    # host read: the split sizes of the uneven all-to-alls that follow (the step's one unavoidable sync)
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
    inp = host_to_device(tensor, ctx.comm_device).contiguous()
    out = torch.empty((sum(recv_counts), *inp.shape[1:]), dtype=inp.dtype, device=ctx.comm_device)
    dist.all_to_all_single(out, inp, output_split_sizes=recv_counts, input_split_sizes=send_counts)
    return out
