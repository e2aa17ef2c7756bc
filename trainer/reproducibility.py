"""Determinism on demand (`trainer.deterministic`) and the random state a checkpoint carries.

On CPU every kernel the trainer uses is sequential, so a run, and a run resumed from a checkpoint,
repeats bit for bit.  On CUDA, sums over duplicate indices (`index_add_`: duplicate-key gradients,
bag pooling, the device cache) use atomics whose order changes between runs, so two runs, or a run
and its resumed twin, agree only within float32 rounding of those sums.  With
`trainer.deterministic: true` the rank turns on `torch.use_deterministic_algorithms` (those sums
become sorted segment sums: `storage.embedding.rows.segments.segment_sum`; cuBLAS needs the
CUBLAS_WORKSPACE_CONFIG that `trainer.launch.torchrun.spec_env` sets), and checkpoints carry the CUDA
generator's state beside the CPU one (dropout on the GPU draws from it), so runs repeat bitwise.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer.stateful import require_keys


def apply_determinism(deterministic: bool) -> None:
    """Turn deterministic algorithms on for this process when asked (nothing otherwise).

    Raises:
        RuntimeError: CUDA without CUBLAS_WORKSPACE_CONFIG (cuBLAS would not be reproducible).
    """
    if not deterministic:
        return
    if torch.cuda.is_available() and not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        raise RuntimeError(
            "trainer.deterministic on CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8 "
            "(trainer.launch.torchrun sets it; export it where torchrun is started by hand)"
        )
    torch.use_deterministic_algorithms(True)


class TorchRNG:
    """torch's generators, Stateful: the CPU one, and the device's on CUDA (between k-step merges
    every rank draws its own numbers, e.g. for dropout).

    Args:
        device: the rank's training device.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    def state_dict(self) -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the generators of `state_dict`.

        Raises:
            ValueError: a state without the CPU generator, or without the CUDA one on a CUDA rank.
        """
        require_keys(state, ("cpu", "cuda") if self.device.type == "cuda" else ("cpu",), "rng")
        torch.set_rng_state(state["cpu"])
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
