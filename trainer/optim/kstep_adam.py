"""Adam on the dense parameters with k-step model merging (Baidu, arXiv 2201.05500).

k > 1: every rank runs Adam (`trainer.optim.fused_adam`) on its own gradients; every k steps
the ranks average the parameters AND both moment estimates (exp_avg m,
exp_avg_sq v) with the two-phase allreduce.  Communication drops k-fold; the
paper bounds the convergence gap by O(sigma / sqrt(k)) and measures no AUC loss
for k up to 200.

k = 1 is synchronous data-parallel Adam, implemented as an allreduce of the
GRADIENTS before each local Adam step, not as a merge after it.  Averaging the
results of independent Adam steps is not the same thing: Adam's update
m / (sqrt(v) + eps) is non-linear in the gradient, so mean_r(update(g_r)) !=
update(mean_r(g_r)) (e.g. with bias correction at step 1 each rank moves by
~lr * sign(g_r) and the mean of signs is not the sign of the mean).  Averaging
the gradients makes every rank take exactly the step one process would take on
the concatenated batch, so the ranks stay identical and no merge is needed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from storage.embedding.base import ADAM_BETAS, ADAM_EPS
from trainer.distributed.collectives import hierarchical_all_reduce
from trainer.distributed.context import DistContext
from trainer.optim.fused_adam import FusedAdam
from trainer.stateful import require_keys

COUNTERS = ("steps", "merges", "sync_bytes", "sync_seconds")


def param_groups(named: list[tuple[str, nn.Parameter]], lr: float, lr_scales: Mapping[str, float]) -> list[dict]:
    """Adam param groups: one per prefix of `lr_scales` at a scale > 0 that names a parameter (lr = scale * lr,
    the scale kept as `lr_scale` for `trainer.optim.schedule.set_step_lrs`), then the rest at `lr`.  The
    parameters of a prefix at scale 0 are in no group (`KStepAdam` holds them still)."""
    groups, rest = [], [p for n, p in named if not any(n.startswith(prefix) for prefix in lr_scales)]
    for prefix, scale in lr_scales.items():
        if scale and (params := [p for n, p in named if n.startswith(prefix)]):
            groups.append({"params": params, "lr": lr * scale, "lr_scale": scale})
    return [{"params": rest, "lr": lr, "lr_scale": 1.0}, *groups]


def held_names(names: Iterable[str], lr_scales: Mapping[str, float]) -> list[str]:
    """The names a prefix of `lr_scales` at scale 0 matches: parameters a day does not train."""
    still = [prefix for prefix, scale in lr_scales.items() if scale == 0]
    return [n for n in names if any(n.startswith(prefix) for prefix in still)]


class KStepAdam:
    """Local Adam on the dense parameters plus k-step merging of parameters and moments.

    Args:
        named_params: the dense parameters by name (identical on every rank at construction); the
            names key the moments in `state_tensors` (a model directory) and `state_dict`.
        ctx: the distributed context (its two-phase groups carry the merges).
        k: merge period in steps; 1 = synchronous DP Adam (gradient allreduce).
        lr, weight_decay: Adam hyper-parameters.
        lr_scales: name prefix -> multiple of `lr` for the parameters whose names start with it
            (their own Adam param group, `lr_scale` in it; `optim.cross_lr_scale`); others take `lr`.
            A prefix at scale 0 holds its parameters still: they stop requiring a gradient (no weight
            gradients in the backward), take no Adam step and no merge, and their moments are saved
            as they were loaded (zeros at step 0 if never), so a later day trains them on.

    Example::

        opt = KStepAdam(model.named_parameters(), ctx, k=10, lr=1e-3)
        for step in range(1, steps + 1):
            loss(...).backward()
            opt.step()          # allreduces gradients first when k == 1
            opt.maybe_merge()   # every k steps when k > 1
        opt.merge()             # at the end: all ranks hold the same parameters
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, nn.Parameter]],
        ctx: DistContext,
        *,
        k: int,
        lr: float,
        weight_decay: float = 0.0,
        lr_scales: Mapping[str, float] | None = None,
    ) -> None:
        if k < 1:
            raise ValueError(f"k (optim.k_steps) must be >= 1, got {k}")
        lr_scales = lr_scales or {}
        named = [(n, p) for n, p in named_params if p.requires_grad]
        held = set(held_names((n for n, _ in named), lr_scales))
        self.held = {n: p.requires_grad_(False) for n, p in named if n in held}
        """Parameters held still (a prefix at scale 0), by name."""
        self._held_moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        named = [(n, p) for n, p in named if n not in held]
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.ctx, self.k = ctx, k
        # fused Adam: one kernel per parameter for the whole update (on CPU too), where foreach runs ~10 multi-tensor
        # ops over every parameter (tests/trainer/optim/test_kstep_adam.py checks it against the per-tensor loop);
        # `FusedAdam` makes torch.optim.Adam(fused=True)'s call without importing torch._dynamo in every rank
        self.adam = FusedAdam(
            param_groups(named, lr, lr_scales), lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=weight_decay
        )
        self.steps = 0
        self.merges = 0
        self.sync_bytes = 0
        self.sync_seconds = 0.0

    def zero_grad(self) -> None:
        self.adam.zero_grad(set_to_none=False)

    def step(self, scaler: torch.amp.GradScaler | None = None) -> None:
        """One Adam step; with k == 1 the gradients are first averaged across ranks.

        Args:
            scaler: fp16's loss scaler (`trainer.precision`): it unscales the gradients and skips the
                step when they overflowed.  With k == 1 it looks after the allreduce, where one rank's
                overflow is every rank's: all skip together and their scales stay equal.
        """
        if self.k == 1 and self.ctx.world_size > 1:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            self._sync([p.grad for p in self.params])  # type: ignore[misc]  # every grad was set just above
        if scaler is None:
            self.adam.step()
        else:
            scaler.step(self.adam)  # type: ignore[arg-type]  # an optimizer by its duck type (FusedAdam)
        self.steps += 1

    def maybe_merge(self, step: int | None = None) -> bool:
        """Merge when `step` (default: steps taken so far) is a multiple of k (never when k == 1)."""
        step = self.steps if step is None else step
        if self.k > 1 and step > 0 and step % self.k == 0:
            self.merge()
            return True
        return False

    def merge(self) -> None:
        """Average parameters, exp_avg and exp_avg_sq across ranks (a no-op with one rank or k == 1).

        With k == 1 the ranks are already identical (gradient allreduce), so nothing is sent.
        """
        if self.ctx.world_size == 1 or self.k == 1:
            return
        self.ensure_state()
        tensors: list[torch.Tensor] = []
        for p in self.params:
            st = self.adam.state[p]
            tensors += [p.data, st["exp_avg"], st["exp_avg_sq"]]
        self._sync(tensors)
        self.merges += 1

    def _sync(self, tensors: list[torch.Tensor]) -> None:
        t0 = time.perf_counter()
        self.sync_bytes += hierarchical_all_reduce(tensors, self.ctx, op="avg")
        self.sync_seconds += time.perf_counter() - t0

    def ensure_state(self) -> None:
        """Create zero moments (step 0) for parameters Adam has not stepped yet."""
        for p in self.params:
            st = self.adam.state[p]
            if not st:  # fused Adam keeps the step where the parameter is
                st["step"] = torch.tensor(0.0, device=p.device)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    # ------------------------------------------------------------------ state

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Moments as `<param name>.exp_avg` / `.exp_avg_sq`, and `step` (int64 (1,)): the model
        directory's `dense_optim.safetensors`, which a warm start continues from."""
        self.ensure_state()
        out: dict[str, torch.Tensor] = {}
        step = 0
        for name, p in zip(self.names, self.params, strict=True):
            st = self.adam.state[p]
            out[f"{name}.exp_avg"] = st["exp_avg"].detach().cpu().contiguous()
            out[f"{name}.exp_avg_sq"] = st["exp_avg_sq"].detach().cpu().contiguous()
            step = max(step, int(st["step"]))
        for name, held in self.held.items():
            m, v = self._held_moments.get(name) or (torch.zeros(held.shape, dtype=held.dtype),) * 2
            out[f"{name}.exp_avg"], out[f"{name}.exp_avg_sq"] = m.clone(), v.clone()
        out["step"] = torch.tensor([step], dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of `state_tensors`: the moments and the bias-correction step continue.

        Raises:
            ValueError: a moment is missing or its shape differs from its parameter's (the saved
                model does not fit: `trainer.model_dir.warm_start` says so before a run starts).
        """
        want = ["step", *(f"{n}.{m}" for n in (*self.names, *self.held) for m in ("exp_avg", "exp_avg_sq"))]
        if missing := [k for k in want if k not in tensors]:
            raise ValueError(f"optimizer state lacks {missing}: it belongs to another architecture")
        step = float(tensors["step"].reshape(-1)[0])
        trained = dict(zip(self.names, self.params, strict=True))
        for name, p in (*trained.items(), *self.held.items()):
            m, v = tensors[f"{name}.exp_avg"], tensors[f"{name}.exp_avg_sq"]
            if m.shape != p.shape or v.shape != p.shape:
                raise ValueError(
                    f"optimizer state of {name} has shape {tuple(m.shape)}, parameter has {tuple(p.shape)}"
                )
            if name in self.held:  # kept as loaded (on the host), saved back unchanged
                self._held_moments[name] = (m.detach().cpu().clone(), v.detach().cpu().clone())
                continue
            self.adam.state[p] = {
                "step": torch.tensor(step, device=p.device),
                "exp_avg": m.to(p.device, p.dtype).clone(),
                "exp_avg_sq": v.to(p.device, p.dtype).clone(),
            }

    def state_dict(self) -> dict[str, Any]:
        """The moments (`state_tensors`) and the counters (`COUNTERS`), for a training checkpoint."""
        return {"moments": self.state_tensors(), **{name: getattr(self, name) for name in COUNTERS}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved.

        Raises:
            ValueError: a key or a moment is missing, or a moment's shape differs.
        """
        require_keys(state, ("moments", *COUNTERS), "optimizer")
        self.load_state_tensors(state["moments"])
        for name in COUNTERS:
            setattr(self, name, state[name])
