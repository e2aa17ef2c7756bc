"""The HET pull protocol: rows of the keys a rank has no copy of, clocks of those it has.

The worker side (which copies may serve, which gradients to hold back) is
`trainer.distributed.staleness.StaleRowCache`; this module is the exchange
with the owners that the cache's pull needs, in four all-to-alls.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from storage.embedding.base import EmbeddingStore, owner_of
from trainer.distributed.collectives import all_to_all_rows
from trainer.distributed.context import DistContext
from trainer.distributed.routing import unique_keys


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
    rm, rc = _exchange_counts(m, c, ctx)

    # 1) keys: to owner r, [its misses, its cached keys, their thresholds]
    seg_c = _segments(c)
    payload = torch.cat(
        [torch.cat([need_s[a:b], check_s[x:y], thr_s[x:y]]) for (a, b), (x, y) in zip(_segments(m), seg_c, strict=True)]
    )
    got = all_to_all_rows(
        payload,
        [mi + 2 * ci for mi, ci in zip(m, c, strict=True)],
        [mi + 2 * ci for mi, ci in zip(rm, rc, strict=True)],
        ctx,
    ).cpu()

    # 2) the owner: clocks of every key asked, rows of the misses and of the stale cached keys
    served = _serve(store, got, rm, rc, dev)

    # 3) clocks back; the requester works out which rows follow
    own_clk = [mi + ci for mi, ci in zip(m, c, strict=True)]
    back_clk = all_to_all_rows(served.clocks.to(dev), served.clock_counts, own_clk, ctx).cpu()
    clk_need_s, clk_check_s = _split_pairs(back_clk, m, own_clk, torch.empty(0, dtype=i64))
    stale_s = clk_check_s > thr_s
    recv_rows = [mi + int(stale_s[x:y].sum()) for mi, (x, y) in zip(m, seg_c, strict=True)]

    # 4) rows back: from owner r, [its misses' rows, its stale cached keys' rows]
    back = all_to_all_rows(served.rows, served.row_counts, recv_rows, ctx).cpu()
    D = store.dim
    need_rows_s, stale_rows_sorted = _split_pairs(back, m, recv_rows, torch.empty(0, D))
    need_rows = torch.empty((need.numel(), D), dtype=back.dtype)
    need_rows[order_n] = need_rows_s
    need_clocks = torch.empty(need.numel(), dtype=i64)
    need_clocks[order_n] = clk_need_s
    check_clocks = torch.empty(check.numel(), dtype=i64)
    check_clocks[order_c] = clk_check_s
    stale = torch.empty(check.numel(), dtype=torch.bool)
    stale[order_c] = stale_s
    # stale rows arrive grouped by owner, in `check_s` order: put them in `check` order
    stale_rows = stale_rows_sorted[torch.argsort(order_c[stale_s])]  # (S, D) in `check` order

    row_b = D * back.element_size()

    def wire(counts: list[int]) -> int:  # items exchanged with the other ranks (this rank's own stay here)
        return sum(counts) - counts[ctx.rank]

    nbytes = {  # (sent, received)
        "pull_keys": (8 * wire(m), 8 * wire(rm)),
        "clock": (16 * wire(c) + 8 * wire(served.clock_counts), 16 * wire(rc) + 8 * wire(own_clk)),
        "pull_rows": (row_b * wire(served.row_counts), row_b * wire(recv_rows)),
    }
    return CachedPull(need_rows, need_clocks, check_clocks, stale, stale_rows, nbytes)


def _exchange_counts(m: list[int], c: list[int], ctx: DistContext) -> tuple[list[int], list[int]]:
    """The first collective: (misses, cached keys) this rank asks of each owner -> those each rank asks of it."""
    W = ctx.world_size
    send_counts = torch.tensor([m, c], dtype=torch.int64).T.reshape(-1)  # (W * 2,): [m_0, c_0, m_1, c_1, ...]
    if W == 1:
        recv = send_counts
    else:
        send_counts = send_counts.to(ctx.comm_device)
        recv = torch.empty_like(send_counts)
        dist.all_to_all_single(recv, send_counts)
    return recv.view(W, 2)[:, 0].tolist(), recv.view(W, 2)[:, 1].tolist()


@dataclass(frozen=True)
class _Served:
    """The owner's side of one pull: what it sends back to the ranks that asked, grouped by rank."""

    clocks: torch.Tensor
    """(A,) int64: the clock of every key asked."""
    rows: torch.Tensor
    """(R, D) fp32 on the communication device: the rows of the misses and of the stale cached keys."""
    clock_counts: list[int]
    """Clocks sent to each rank (the keys it asked)."""
    row_counts: list[int]
    """Rows sent to each rank."""


def _serve(store: EmbeddingStore, got: torch.Tensor, rm: list[int], rc: list[int], dev: torch.device) -> _Served:
    """The owner: clocks of the keys each rank asked, and rows of its misses and of its cached keys whose clock
    passed their threshold.  `got` holds, from rank r, [its rm[r] misses, its rc[r] cached keys, their thresholds]."""
    i64 = torch.int64
    parts_keys, parts_thr, lo = [], [], 0
    for mi, ci in zip(rm, rc, strict=True):
        parts_keys += [got[lo : lo + mi + ci]]
        parts_thr += [torch.cat([torch.full((mi,), -1, dtype=i64), got[lo + mi + ci : lo + mi + 2 * ci]])]
        lo += mi + 2 * ci
    asked = torch.cat(parts_keys) if parts_keys else torch.empty(0, dtype=i64)
    asked_thr = torch.cat(parts_thr) if parts_thr else torch.empty(0, dtype=i64)
    uniq, inv = unique_keys(asked)
    _, rows = store.read_rows(uniq.numpy())
    clocks = rows.clock.cpu().to(i64)[inv]  # (A,)
    send_row = clocks > asked_thr  # misses (threshold -1) always
    served = store.row_format.weights(rows.emb.to(dev))[inv.to(dev)][
        send_row.to(dev)
    ]  # (R, D) fp32, grouped by requester
    sizes_clk = [mi + ci for mi, ci in zip(rm, rc, strict=True)]
    sizes_rows, lo = [], 0
    for n in sizes_clk:
        sizes_rows.append(int(send_row[lo : lo + n].sum()))
        lo += n
    return _Served(clocks, served, sizes_clk, sizes_rows)


def _split_pairs(
    back: torch.Tensor, firsts: list[int], sizes: list[int], empty: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`back`, blocks of `sizes` from each rank, each block [its first `firsts[r]` items, the rest]: (every block's
    first part, every block's rest), each concatenated in rank order (`empty` when there are no blocks)."""
    heads, tails, lo = [], [], 0
    for first, n in zip(firsts, sizes, strict=True):
        heads.append(back[lo : lo + first])
        tails.append(back[lo + first : lo + n])
        lo += n
    return (torch.cat(heads) if heads else empty), (torch.cat(tails) if tails else empty)
