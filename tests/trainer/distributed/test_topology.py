"""Pure topology math (no process group) and the sysfs helpers on a fake /sys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.distributed.topology import (
    UNKNOWN_SOCKET,
    RankPlace,
    bind_io_threads,
    detect_socket,
    emulated_places,
    numa_cpus,
    numa_node_of_cpus,
    numa_node_of_pci,
    parse_cpulist,
    two_phase_groups,
)


def _grid(nodes: int, sockets: int, per_socket: int) -> list[RankPlace]:
    return [RankPlace(f"n{n}", s) for n in range(nodes) for s in range(sockets) for _ in range(per_socket)]


@pytest.mark.parametrize("nodes", [1, 2, 3, 8])
@pytest.mark.parametrize("sockets", [1, 2, 4])
@pytest.mark.parametrize("per_socket", [1, 2, 4])
def test_grid_shapes(nodes: int, sockets: int, per_socket: int) -> None:
    topo = two_phase_groups(_grid(nodes, sockets, per_socket))
    world = nodes * sockets * per_socket
    assert len(topo.groups) == nodes * sockets
    assert all(len(g) == per_socket for g in topo.groups)
    assert sorted(r for g in topo.groups for r in g) == list(range(world))  # a partition
    assert topo.leaders == tuple(range(0, world, per_socket))
    for r in range(world):
        assert r in topo.group(r) and topo.leader(r) == r - r % per_socket
        assert topo.is_leader(r) == (r % per_socket == 0)


def test_unknown_socket_groups_the_whole_node() -> None:
    places = [
        RankPlace("a", 0),
        RankPlace("a", UNKNOWN_SOCKET),
        RankPlace("a", 1),
        RankPlace("b", 0),
        RankPlace("b", 1),
    ]
    topo = two_phase_groups(places)
    assert topo.groups == ((0, 1, 2), (3,), (4,))
    assert topo.leaders == (0, 3, 4)


def test_interleaved_ranks_and_single_rank() -> None:
    # torchrun may hand out ranks so that a socket's ranks are not consecutive
    places = [RankPlace("a", 0), RankPlace("a", 1), RankPlace("a", 0), RankPlace("a", 1)]
    topo = two_phase_groups(places)
    assert topo.groups == ((0, 2), (1, 3)) and topo.leaders == (0, 1) and topo.group_of == (0, 1, 0, 1)
    one = two_phase_groups([RankPlace("x")])
    assert one.groups == ((0,),) and one.leaders == (0,)
    with pytest.raises(ValueError):
        two_phase_groups([])


def test_emulated_places() -> None:
    assert two_phase_groups(emulated_places(4, 2)).groups == ((0, 1), (2, 3))
    assert two_phase_groups(emulated_places(6, 3)).leaders == (0, 3)
    with pytest.raises(ValueError, match=r"intra_group_size \(3\) must be >= 1 and divide the world size \(4\)"):
        emulated_places(4, 3)


def test_parse_cpulist() -> None:
    assert parse_cpulist("0-3,8-9,12\n") == {0, 1, 2, 3, 8, 9, 12}
    assert parse_cpulist("") == set()


def _fake_sys(root: Path, nodes: dict[int, str]) -> None:
    for n, cpus in nodes.items():
        d = root / "devices/system/node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")


def test_sysfs_helpers(tmp_path: Path) -> None:
    _fake_sys(tmp_path, {0: "0-3", 1: "4-7"})
    assert numa_cpus(str(tmp_path)) == {0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}
    assert numa_node_of_cpus({4, 5, 1}, numa_cpus(str(tmp_path))) == 1
    assert numa_node_of_cpus({42}, numa_cpus(str(tmp_path))) == UNKNOWN_SOCKET
    dev = tmp_path / "bus/pci/devices/0000:17:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    assert numa_node_of_pci("0000:17:00.0", str(tmp_path)) == 1
    (dev / "numa_node").write_text("-1\n")  # firmware did not say
    assert numa_node_of_pci("0000:17:00.0", str(tmp_path)) == UNKNOWN_SOCKET
    assert numa_node_of_pci("0000:99:00.0", str(tmp_path)) == UNKNOWN_SOCKET
    assert detect_socket("cpu", None, str(tmp_path / "nothing")) == UNKNOWN_SOCKET


def test_bind_io_threads_is_harmless_with_one_node(tmp_path: Path) -> None:
    before = os.sched_getaffinity(0)
    _fake_sys(tmp_path, {0: "0-1023"})
    assert bind_io_threads(0, sysfs_root=str(tmp_path)) is None
    assert bind_io_threads(UNKNOWN_SOCKET) is None
    assert os.sched_getaffinity(0) == before


def test_bind_io_threads_pins_a_thread(tmp_path: Path) -> None:
    import threading

    allowed = sorted(os.sched_getaffinity(0))
    _fake_sys(tmp_path, {0: str(allowed[0]), 1: "100000"})
    got: list[object] = []

    def io_thread() -> None:
        got.append(bind_io_threads(0, sysfs_root=str(tmp_path)))
        got.append(os.sched_getaffinity(0))

    t = threading.Thread(target=io_thread)
    t.start()
    t.join()
    assert got == [{allowed[0]}, {allowed[0]}]
    assert sorted(os.sched_getaffinity(0)) == allowed  # only the IO thread was pinned
