"""Sparse routing: which rank owns which key, and the all-to-all of keys, rows and gradients.

Rank r owns the keys with `owner_of(key, world) == r`.  A rank deduplicates
its keys once (`route_keys`, pure), sends each distinct key to its owner
(`exchange_keys`), gets the owners' rows back in the same order
(`exchange_rows`), and later sends the summed gradient of each distinct key
back along the same route (`send_route_grads`: the owner knows the keys and
the counts from the pull, so one all-to-all of gradients is the whole push),
which the owner applies to its store.  A push whose keys were not pulled
(the HET cache's) routes them afresh (`send_grads`, `apply_updates`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from storage.embedding.base import EmbeddingStore, Lookup, owner_of
from storage.embedding.rows.segments import segment_sum
from storage.embedding.rows.transfer import host_to_device
from trainer.distributed.collectives import all_to_all_rows, exchange_counts
from trainer.distributed.context import DistContext


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
    instead of sorting all N; every step routes its keys.  Same result, bit for bit.
    """
    if keys.device.type != "cpu" or keys.dtype != torch.int64:
        unique_inverse: tuple[torch.Tensor, torch.Tensor] = torch.unique(keys, return_inverse=True)
        return unique_inverse
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
    # host read: the keys are host tensors (the reader's), so this reads no device
    return Route(unique=unique, inverse=inverse, order=order, send_counts=counts.tolist())


def _by_owner(t: torch.Tensor, route: Route, world_size: int) -> torch.Tensor:
    """`t` (U, ...) in `route.unique` order -> grouped by owner (`t[route.order]`; `t` itself with one rank)."""
    return t if world_size == 1 else t.index_select(0, host_to_device(route.order, t.device))


def remote_counts(send_counts: list[int], recv_counts: list[int], rank: int) -> tuple[int, int]:
    """(items sent to, items received from) the other ranks: a rank's own items never leave it."""
    return sum(send_counts) - send_counts[rank], sum(recv_counts) - recv_counts[rank]


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
    return torch.empty_like(back).index_copy_(0, host_to_device(route.order, back.device), back)


def send_route_grads(
    route: Route, recv_counts: list[int], grads: torch.Tensor, ctx: DistContext
) -> tuple[torch.Tensor, tuple[int, int]]:
    """Sum the gradients (N, D) of the keys a pull routed and send them back along its route.

    The owners received these keys at the pull, in this order, with these counts: neither the keys
    nor the counts travel again, so the push is one all-to-all (no count exchange, no host read).

    Args:
        route, recv_counts: the pull's (`exchange_keys`).

    Returns:
        (the gradients of the keys this rank served at the pull (M, D), in their order,
        (bytes sent to, bytes received from) the other ranks).
    """
    grads = grads.reshape(route.inverse.numel(), grads.shape[-1])  # (N, D)
    summed = segment_sum(grads, route.inverse, route.unique.numel())  # (U, D)
    owned_grads = all_to_all_rows(_by_owner(summed, route, ctx.world_size), route.send_counts, recv_counts, ctx)
    row_b = summed.shape[1] * summed.element_size()
    sent, received = remote_counts(route.send_counts, recv_counts, ctx.rank)
    return owned_grads, (row_b * sent, row_b * received)


def send_grads(
    route: Route, grads: torch.Tensor, ctx: DistContext, counts: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, tuple[int, int]]:
    """Sum the gradients (N, D) (and `counts` (N,)) of the keys `route` deduplicated and send them to the owners.

    Args:
        route: `route_keys` of the keys the gradients belong to (the pull's own route, when it has one).
        counts: updates each gradient sums (the HET cache's pending sums), or None for one each.

    Returns:
        (keys this rank owns (M,), their gradients (M, D), their counts (M,) or None,
        (bytes sent to, bytes received from) the other ranks).
    """
    grads = grads.reshape(route.inverse.numel(), grads.shape[-1])  # (N, D), N may be 0
    D = grads.shape[1]
    if counts is not None:  # the update counts ride as one more float32 column (exact below 2^24)
        grads = torch.cat([grads, counts.reshape(-1, 1).to(grads)], dim=1)  # (N, D + 1)
    summed = segment_sum(grads, route.inverse, route.unique.numel())  # (U, D[+1])
    recv_counts = exchange_counts(route.send_counts, ctx)
    owned = all_to_all_rows(_by_owner(route.unique, route, ctx.world_size), route.send_counts, recv_counts, ctx)
    owned_grads = all_to_all_rows(_by_owner(summed, route, ctx.world_size), route.send_counts, recv_counts, ctx)
    row_b = 8 + summed.shape[1] * summed.element_size()  # key + gradient (+ count) of one row
    sent, received = remote_counts(route.send_counts, recv_counts, ctx.rank)
    if counts is None:
        return owned, owned_grads, None, (row_b * sent, row_b * received)
    return owned, owned_grads[:, :D], owned_grads[:, D].round().to(torch.int64), (row_b * sent, row_b * received)


def apply_updates(
    store: EmbeddingStore,
    target: torch.Tensor | Lookup,
    grads: torch.Tensor,
    counts: torch.Tensor | None,
    *,
    lr: float,
    weight_decay: float = 0.0,
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
