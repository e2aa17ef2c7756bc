"""Adam on the dense parameters as one fused kernel per parameter, without torch's optimizer base class.

`torch.optim.Adam` imports `torch._dynamo` (and with it sympy and the FX tracer) the first time it adds a param group,
because its base class's methods are wrapped to keep the compiler out of them: seconds of every rank's start, for a
compiler the ranks never run.  `FusedAdam` makes the call `torch.optim.Adam(fused=True)` makes, `torch._fused_adam_`
per device and dtype, on the same state (`state[p]`: `step`, `exp_avg`, `exp_avg_sq`) and param groups, so its steps
are bit-equal to that optimizer's (`tests/trainer/optim/test_fused_adam.py` holds this, fp16's loss scaler included).
It is not the sparse rows' optimizer (`storage.embedding.rows.sparse_optim`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch


class FusedAdam:
    """Adam (L2 weight decay, no amsgrad) over `param_groups`, each a dict with `params` and optionally `lr` and any
    other key, kept as given (`trainer.optim.kstep_adam.param_groups` adds `lr_scale`).

    Like torch's optimizers it has `param_groups` (the schedule sets their `lr`), `state` (per parameter, made
    at its first step) and `defaults`, and `torch.amp.GradScaler` steps it: with `_step_supports_amp_scaling`
    the scaler sets `grad_scale` and `found_inf` on it, the kernel unscales the gradients and skips the update (and
    the step count) when they overflowed.
    """

    _step_supports_amp_scaling = True

    def __init__(
        self,
        param_groups: Iterable[dict[str, Any]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float = 0.0,
    ) -> None:
        self.defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "fused": True}
        self.param_groups = [{**self.defaults, **g, "params": list(g["params"])} for g in param_groups]
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:
            for g in self.param_groups:
                for p in g["params"]:
                    p.grad = None
            return
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        for grad in grads:
            if grad.grad_fn is not None:
                grad.detach_()
            else:
                grad.requires_grad_(False)
        for same in _by_device_and_dtype(grads).values():
            torch._foreach_zero_(same)

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient."""
        grad_scale: torch.Tensor | None = getattr(self, "grad_scale", None)  # set by the loss scaler, see the class
        found_inf: torch.Tensor | None = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            beta1, beta2 = group["betas"]
            for (device, _), same in _by_device_and_dtype(params).items():
                states = [self._state_of(p) for p in same]
                steps = [st["step"] for st in states]
                torch._foreach_add_(steps, 1)
                found = None if found_inf is None else found_inf.to(device, non_blocking=True)
                torch._fused_adam_(
                    same,
                    [p.grad for p in same],  # type: ignore[misc]  # `same` are the parameters with a gradient
                    [st["exp_avg"] for st in states],
                    [st["exp_avg_sq"] for st in states],
                    [],
                    steps,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    amsgrad=False,
                    maximize=False,
                    grad_scale=None if grad_scale is None else grad_scale.to(device, non_blocking=True),
                    found_inf=found,
                )
                if found is not None:  # an overflowed step did not count
                    torch._foreach_sub_(steps, [found] * len(steps))

    def _state_of(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        st = self.state[p]
        if not st:  # as torch.optim.Adam(fused=True) makes it: the step where the parameter is, as float32
            st["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return st


def _by_device_and_dtype(tensors: list[torch.Tensor]) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    out: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for t in tensors:
        out[(t.device, t.dtype)].append(t)
    return out
