"""Rank malloc settings: blocks under 32 MiB come from the heap and a freed heap top is kept, so a
step's tensors do not fault their pages in again every step (`trainer.malloc.tune_malloc`)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.malloc import M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, SETTINGS, tune_malloc

_REPO = Path(__file__).resolve().parents[2]


class _FakeLibc:
    def __init__(self, refuse: tuple[int, ...] = ()) -> None:
        self.calls: list[tuple[int, int]] = []
        self.refuse = refuse

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 0 if param in self.refuse else 1


def test_ranks_ask_for_heap_blocks_under_32_mib_and_keep_256_mib_of_free_heap() -> None:
    assert SETTINGS == ((M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 256 << 20))
    libc = _FakeLibc()
    assert tune_malloc(libc, settings=()) == []
    assert libc.calls == []


def test_tune_malloc_reports_only_what_glibc_accepted() -> None:
    libc = _FakeLibc(refuse=(M_TRIM_THRESHOLD,))
    assert tune_malloc(libc) == [(M_MMAP_THRESHOLD, 32 << 20)]
    assert libc.calls == [(M_MMAP_THRESHOLD, 32 << 20), (M_TRIM_THRESHOLD, 256 << 20)]
    assert tune_malloc(object()) == []  # a C library without mallopt: nothing to do


_STEPS = """
import json, resource, sys, torch
from trainer.malloc import tune_malloc
applied = tune_malloc()
def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a step's transient tensors: 4 x 16 MiB written, then freed
    ts = [torch.ones(4 << 20) for _ in range(4)]
    del ts
for _ in range(3): step()
f0 = faults()
for _ in range(20): step()
print(json.dumps({"applied": applied, "faults_per_step": (faults() - f0) / 20}))
"""


@pytest.mark.subprocess  # a fresh process
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc mallopt")
def test_a_tuned_process_stops_faulting_its_step_memory_in_again() -> None:
    out = subprocess.run([sys.executable, "-c", _STEPS], capture_output=True, text=True, check=True, cwd=_REPO)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["applied"] == [[M_MMAP_THRESHOLD, 32 << 20], [M_TRIM_THRESHOLD, 256 << 20]]
    pages = 4 * (16 << 20) // 4096
    # glibc's dynamic defaults fault the 64 MiB in again every step (all 16,384 pages); tuned, the heap may
    # still grow once over the 20 measured steps and fault the step's memory in once, plus the odd page of
    # the interpreter's own (16,385 pages / 20 steps = 819.25 was seen): bound it at twice, 10x fewer
    assert got["faults_per_step"] <= pages / 10, got
