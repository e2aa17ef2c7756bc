"""Where each rank runs, and the groups of the two-phase allreduce.

Pure functions first (no process group, testable for any shape), then the
helpers that read this machine's topology from sysfs and pin threads.

Two-phase allreduce (Baidu, arXiv 2201.05500): ranks that share a node and a
CPU socket (NUMA node) talk over fast links, so phase 1 reduces inside such a
group to its leader, phase 2 allreduces among the leaders over the slow links
(inter-socket, network), phase 3 broadcasts the result inside each group.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

UNKNOWN_SOCKET = -1


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank runs: its node (host name or id) and NUMA node (-1 when unknown)."""

    node: str
    socket: int = UNKNOWN_SOCKET


@dataclass(frozen=True, slots=True)
class TwoPhaseGroups:
    """The groups of the two-phase allreduce.

    Attributes:
        groups: phase-1 groups, each a sorted list of global ranks; ordered by their leader.
        leaders: the leader (lowest rank) of each group, in the same order; the phase-2 group.
        group_of: for each rank, the index of its group in `groups`.
    """

    groups: tuple[tuple[int, ...], ...]
    leaders: tuple[int, ...]
    group_of: tuple[int, ...]

    def group(self, rank: int) -> tuple[int, ...]:
        return self.groups[self.group_of[rank]]

    def leader(self, rank: int) -> int:
        return self.leaders[self.group_of[rank]]

    def is_leader(self, rank: int) -> bool:
        return self.leader(rank) == rank


def two_phase_groups(places: Sequence[RankPlace]) -> TwoPhaseGroups:
    """Group ranks by (node, socket) when every rank of a node knows its socket, else by node.

    Args:
        places: the place of every rank, indexed by global rank.

    Returns:
        The phase-1 groups and their leaders (lowest rank of each group).

    Raises:
        ValueError: no ranks.

    Example::

        # 2 nodes x 2 sockets x 2 GPUs
        p = [RankPlace("a", 0), RankPlace("a", 0), RankPlace("a", 1), RankPlace("a", 1),
             RankPlace("b", 0), RankPlace("b", 0), RankPlace("b", 1), RankPlace("b", 1)]
        two_phase_groups(p).groups  # ((0, 1), (2, 3), (4, 5), (6, 7)); leaders (0, 2, 4, 6)
    """
    if not places:
        raise ValueError("two_phase_groups needs at least one rank")
    # a node where any rank's socket is unknown is grouped as a whole: a partial
    # socket split would put ranks of the same socket in different groups
    unknown_nodes = {p.node for p in places if p.socket == UNKNOWN_SOCKET}
    keys = [(p.node, UNKNOWN_SOCKET if p.node in unknown_nodes else p.socket) for p in places]
    members: dict[tuple[str, int], list[int]] = {}
    for rank, key in enumerate(keys):
        members.setdefault(key, []).append(rank)
    groups = sorted((tuple(m) for m in members.values()), key=lambda g: g[0])
    group_of = [0] * len(places)
    for i, g in enumerate(groups):
        for r in g:
            group_of[r] = i
    return TwoPhaseGroups(groups=tuple(groups), leaders=tuple(g[0] for g in groups), group_of=tuple(group_of))


def emulated_places(world_size: int, ranks_per_group: int) -> list[RankPlace]:
    """Places of `world_size` ranks where each run of `ranks_per_group` consecutive ranks is one node.

    Used for `TrainerConfig.intra_group_size > 0` (e.g. 2 "nodes" x 2 ranks on one machine).

    Raises:
        ValueError: `ranks_per_group` < 1 or does not divide `world_size`.
    """
    if ranks_per_group < 1 or world_size % ranks_per_group != 0:
        raise ValueError(f"intra_group_size ({ranks_per_group}) must be >= 1 and divide the world size ({world_size})")
    return [RankPlace(node=f"node{r // ranks_per_group}", socket=0) for r in range(world_size)]


# ----------------------------------------------------------------------------- sysfs


def parse_cpulist(text: str) -> set[int]:
    """CPUs of a sysfs cpulist such as `0-3,8-11,16` (empty text -> empty set)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            cpus.update(range(int(a), int(b) + 1))
        else:
            cpus.add(int(part))
    return cpus


def numa_cpus(sysfs_root: str = "/sys") -> dict[int, set[int]]:
    """CPUs of every NUMA node from `<sysfs_root>/devices/system/node/node*/cpulist` ({} when absent)."""
    out: dict[int, set[int]] = {}
    for path in glob.glob(os.path.join(sysfs_root, "devices/system/node/node*/cpulist")):
        m = re.search(r"node(\d+)/cpulist$", path)
        if m is None:
            continue
        try:
            with open(path) as f:
                out[int(m.group(1))] = parse_cpulist(f.read())
        except OSError:
            continue
    return out


def numa_node_of_pci(bus_id: str, sysfs_root: str = "/sys") -> int:
    """NUMA node of a PCI device (a GPU) from `/sys/bus/pci/devices/<bus id>/numa_node`; -1 when unknown."""
    path = os.path.join(sysfs_root, "bus/pci/devices", bus_id.lower(), "numa_node")
    try:
        with open(path) as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return UNKNOWN_SOCKET
    return node if node >= 0 else UNKNOWN_SOCKET


def numa_node_of_cpus(cpus: set[int], nodes: dict[int, set[int]]) -> int:
    """The NUMA node holding most of `cpus` (a process's affinity); -1 when none overlaps."""
    best, best_overlap = UNKNOWN_SOCKET, 0
    for node, node_cpus in sorted(nodes.items()):
        overlap = len(cpus & node_cpus)
        if overlap > best_overlap:
            best, best_overlap = node, overlap
    return best


def gpu_bus_id(device_index: int) -> str | None:
    """PCI bus id (`0000:17:00.0`) of a CUDA device, or None when torch cannot tell."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device_index)
    try:
        # not in the stubs of the torch CI installs; newer builds have them (older ones: AttributeError, below)
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"  # type: ignore[attr-defined]
    except AttributeError:
        return None


def detect_socket(device_type: str, device_index: int | None, sysfs_root: str = "/sys") -> int:
    """NUMA node of this rank: its GPU's for CUDA, else the node of its CPU affinity; -1 when unknown."""
    if device_type == "cuda" and device_index is not None:
        bus = gpu_bus_id(device_index)
        if bus is not None:
            node = numa_node_of_pci(bus, sysfs_root)
            if node != UNKNOWN_SOCKET:
                return node
    return numa_node_of_cpus(set(os.sched_getaffinity(0)), numa_cpus(sysfs_root))


def bind_io_threads(socket: int, *, sysfs_root: str = "/sys") -> set[int] | None:
    """Pin the calling thread to the CPUs of NUMA node `socket` that it may run on.

    Call it from each IO thread (the batch reader): Linux affinity is per
    thread, and new threads inherit their creator's.  On a one-node machine, an
    unknown socket, or when the node's CPUs and the allowed CPUs do not overlap,
    nothing changes.

    Returns:
        The CPU set applied, or None when nothing was changed.
    """
    if socket == UNKNOWN_SOCKET or not hasattr(os, "sched_setaffinity"):
        return None
    nodes = numa_cpus(sysfs_root)
    if len(nodes) < 2 or socket not in nodes:
        return None
    cpus = nodes[socket] & set(os.sched_getaffinity(0))
    if not cpus:
        return None
    os.sched_setaffinity(0, cpus)
    return cpus
