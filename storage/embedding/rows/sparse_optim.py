"""Sparse optimizers: the update rule of an embedding row and the per-row state it needs.

The store keeps whatever state the configured optimizer declares (`SparseOptimizer.state`), on
every tier and in snapshots, and moves it without knowing what it means; the optimizer alone reads
it, in `step`.  Six rules (`optim.sparse_optimizer`):

- `rowwise_adagrad`: fbgemm's row-wise AdaGrad, TorchRec's usual sparse optimizer: one fp32
  accumulator per row, `acc += mean(g^2)`, `row -= lr * g / (sqrt(acc) + eps)`.  One value of state.
- `adam`: lazy per-element Adam, each row bias-corrected by its own update count (`clock`): exactly
  `torch.optim.Adam` on a parameter per row stepped only when touched.  2 * dim values of state.
- `wide_rowwise_adam` (the default): partial row-wise Adam with two second moments per row, one for column 0
  (the key's wide weight, `model.wide`) and one shared by the other columns.  dim + 2 values of state: with
  int8s rows and log8 state, the 48-byte record at dim 16.  With one `v` per row the wide weight's large
  gradient would set every column's step (`docs/reports/2026-12-03-48-byte-rows.md`).
- `partial_rowwise_adam`: fbgemm's PARTIAL_ROWWISE_ADAM: Adam's first moment `m` per element, its second
  moment `v` one value per row (the EMA of mean(g^2)), each row bias-corrected by its clock.  dim + 1 values
  of state (a 47-byte record on int8s rows with log8 state); it loses AUC on this project's model, whose column
  0 is the wide weight.
- `rmsprop`: Adam without its first moment (beta1 = 0): the per-element second moment `v`, bias-corrected
  by the row's clock, normalises each step; `dim` values of state.  With int8 rows and log8 state it
  is a 48-byte record at dim 16.
- `sgd`: `row -= lr * g`; no state.

All of them add L2 `weight_decay * row` to the gradient (fbgemm's L2 mode).  `step` works in fp32 on
fp32 rows and state; storing them in the row and state dtypes (4 bytes a value in fp32, 1 in log8) is
`storage.embedding.rows.format`'s job.

`convert_state` turns one optimizer's state into another's when a day continues a model trained
with another rule (`RowFormat.convert`); the rules are in its docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
ADAGRAD_EPS = 1e-8
"""fbgemm's default `eps` for row-wise AdaGrad."""


@dataclass(frozen=True)
class StateField:
    """One tensor of per-row optimizer state: (N, dim) when `per_element`, (N, columns) when `columns`, else (N,);
    `signed` when its values take either sign (an 8-bit code keeps a sign bit for it).  Its values are fp32
    here; the row format stores them in its `state_dtype`."""

    name: str
    per_element: bool
    signed: bool = False
    columns: int = 0

    def cols(self, dim: int) -> int | None:
        """Values per row in a (N, cols) tensor, or None for one value per row in an (N,) tensor."""
        return dim if self.per_element else (self.columns or None)

    def shape(self, n: int, dim: int) -> tuple[int, ...]:
        c = self.cols(dim)
        return (n,) if c is None else (n, c)


class SparseOptimizer:
    """An update rule for embedding rows and the state it keeps per row (see the module docstring)."""

    name: str = ""
    state: tuple[StateField, ...] = ()

    def step(
        self,
        emb: torch.Tensor,
        state: dict[str, torch.Tensor],
        clock: torch.Tensor,
        grads: torch.Tensor,
        *,
        lr: float,
        weight_decay: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The new fp32 rows and state after one step with `grads` ((N, dim) fp32).

        `clock` is the rows' update count after this step (>= 1).  Returns new tensors; the inputs are unchanged.
        """
        raise NotImplementedError


def _second_moment(v: torch.Tensor, g_sq: torch.Tensor, clock: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Adam's new second moment of the squared gradients `g_sq` and the step's divisor, bias-corrected by each
    row's own `clock`: (v, sqrt(v / (1 - beta2^clock)) + eps), shared by `adam`, `partial_rowwise_adam` and
    `rmsprop`."""
    b2 = ADAM_BETAS[1]
    v = v * b2 + (1 - b2) * g_sq
    t = clock.to(torch.float64)
    bc2_sqrt = torch.sqrt(1 - torch.pow(torch.full_like(t, b2), t)).to(torch.float32)[:, None]
    return v, v.sqrt() / bc2_sqrt + ADAM_EPS


def group_means(x: torch.Tensor, cols: int | None) -> torch.Tensor:
    """Per-element values (N, dim) as a second moment of `cols` values per row (`StateField.cols`): all of them
    when `cols` is dim; None: the row's mean, (N,); 2: column 0 and the mean of the other columns, (N, 2)."""
    if cols == x.shape[1]:
        return x
    if cols is None:
        return x.mean(dim=1)
    return torch.stack([x[:, 0], x[:, 1:].mean(dim=1)], dim=1)


def spread_groups(v: torch.Tensor, dim: int) -> torch.Tensor:
    """A second moment as `group_means` keeps it, one value per element: (N, dim), or (N, 1) that broadcasts."""
    if v.dim() == 1:
        return v[:, None]
    if v.shape[1] in (1, dim):
        return v
    return torch.cat([v[:, :1], v[:, 1:].expand(-1, dim - 1)], dim=1)


def second_moment_field(rule: SparseOptimizer) -> StateField | None:
    """The rule's `v`, the EMA of squared gradients (adam, the row-wise Adams, rmsprop), or None."""
    return next((f for f in rule.state if f.name == "v"), None)


class SparseAdam(SparseOptimizer):
    """Lazy Adam; its subclasses keep `v` over groups of columns (`group_means`), `m` per element."""

    name = "adam"
    state = (StateField("m", True, signed=True), StateField("v", True))

    def v_cols(self, dim: int) -> int | None:
        """Values of `v` per row (`StateField.cols` of the rule's `v`, whichever its place in `state`)."""
        field = second_moment_field(self)
        assert field is not None, f"{self.name} declares no v"  # noqa: S101 - every SparseAdam declares one
        return field.cols(dim)

    def step(
        self,
        emb: torch.Tensor,
        state: dict[str, torch.Tensor],
        clock: torch.Tensor,
        grads: torch.Tensor,
        *,
        lr: float,
        weight_decay: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        b1, dim = ADAM_BETAS[0], emb.shape[1]
        g = grads if weight_decay == 0 else grads + weight_decay * emb
        m = torch.lerp(state["m"], g, 1 - b1)
        v_in = state["v"]
        g_sq = group_means(g * g, self.v_cols(dim))
        v, denom = _second_moment(v_in.reshape(len(v_in), -1), g_sq.reshape(len(g_sq), -1), clock)
        t = clock.to(torch.float64)
        step = (lr / (1 - torch.pow(torch.full_like(t, b1), t))).to(torch.float32)[:, None]
        return emb - step * (m / spread_groups(denom, dim)), {"m": m, "v": v.reshape(v_in.shape)}


class PartialRowwiseAdam(SparseAdam):
    name = "partial_rowwise_adam"
    state = (StateField("m", True, signed=True), StateField("v", False))


class WideRowwiseAdam(SparseAdam):
    name = "wide_rowwise_adam"
    state = (StateField("m", True, signed=True), StateField("v", False, columns=2))


class SparseRmsprop(SparseOptimizer):
    name = "rmsprop"
    state = (StateField("v", True),)

    def step(
        self,
        emb: torch.Tensor,
        state: dict[str, torch.Tensor],
        clock: torch.Tensor,
        grads: torch.Tensor,
        *,
        lr: float,
        weight_decay: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        g = grads if weight_decay == 0 else grads + weight_decay * emb
        v, denom = _second_moment(state["v"], g * g, clock)
        return emb - lr * (g / denom), {"v": v}


class RowwiseAdagrad(SparseOptimizer):
    name = "rowwise_adagrad"
    state = (StateField("acc", False),)

    def step(
        self,
        emb: torch.Tensor,
        state: dict[str, torch.Tensor],
        clock: torch.Tensor,
        grads: torch.Tensor,
        *,
        lr: float,
        weight_decay: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        g = grads if weight_decay == 0 else grads + weight_decay * emb
        acc = state["acc"] + (g * g).mean(dim=1)
        return emb - (lr / (acc.sqrt() + ADAGRAD_EPS))[:, None] * g, {"acc": acc}


class SparseSgd(SparseOptimizer):
    name = "sgd"
    state = ()

    def step(
        self,
        emb: torch.Tensor,
        state: dict[str, torch.Tensor],
        clock: torch.Tensor,
        grads: torch.Tensor,
        *,
        lr: float,
        weight_decay: float,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        g = grads if weight_decay == 0 else grads + weight_decay * emb
        return emb - lr * g, {}


OPTIMIZERS: dict[str, SparseOptimizer] = {
    o.name: o
    for o in (RowwiseAdagrad(), SparseAdam(), PartialRowwiseAdam(), WideRowwiseAdam(), SparseRmsprop(), SparseSgd())
}
"""`optim.sparse_optimizer` name -> rule."""


def get_optimizer(name: str) -> SparseOptimizer:
    """The rule called `name`; a `ValueError` listing the names for any other."""
    try:
        return OPTIMIZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown sparse optimizer {name!r}; optim.sparse_optimizer is one of {sorted(OPTIMIZERS)}"
        ) from None


def convert_state(
    src: SparseOptimizer, dst: SparseOptimizer, state: dict[str, torch.Tensor], clock: torch.Tensor, dim: int
) -> dict[str, torch.Tensor]:
    """`dst`'s state for rows that `src` trained (`clock` updates each).

    - same rule: the state as it is;
    - between the second-moment rules (adam, partial_rowwise_adam, wide_rowwise_adam, rmsprop): `v` kept, as the
      mean over the columns a value of `dst` covers, and repeated over the columns a value of `src` covered; `m`
      kept, dropped, or zero when added;
    - a second-moment rule -> rowwise_adagrad: the accumulator is the sum of the row's squared gradients so far,
      estimated as clock * mean over the row of the bias-corrected second moment v / (1 - beta2^clock);
    - rowwise_adagrad -> a second-moment rule: m = 0, and v such that its bias-corrected value is acc / clock on
      every element;
    - to sgd: nothing; from sgd: zero state (the first steps then move rows by about lr, as on a new row).
    """
    if src.name == dst.name:
        return state
    n = int(clock.shape[0])
    dev = clock.device
    t = clock.to(torch.float64)
    bc2 = (1 - torch.pow(torch.full_like(t, ADAM_BETAS[1]), t)).clamp_min(1e-12)
    v: torch.Tensor | None = None  # (N, dim): the second moment of each element, as src keeps or implies it
    if second_moment_field(src) is not None:
        v = spread_groups(state["v"], dim).expand(n, dim)
    elif src.name == "rowwise_adagrad":
        per = torch.where(clock > 0, state["acc"].to(torch.float64) / t.clamp_min(1) * bc2, 0.0).to(torch.float32)
        v = per[:, None].expand(n, dim)
    dst_v = second_moment_field(dst)
    if v is not None and dst.name == "rowwise_adagrad":
        mean_v = v.to(torch.float64).mean(dim=1) / bc2
        return {"acc": torch.where(clock > 0, t * mean_v, 0.0).to(torch.float32)}
    if v is not None and dst_v is not None:
        out = {"v": group_means(v, dst_v.cols(dim)).contiguous()}
        if any(f.name == "m" for f in dst.state):
            out["m"] = state["m"] if "m" in state else torch.zeros(n, dim, device=dev)
        return out
    return {f.name: torch.zeros(f.shape(n, dim), device=dev) for f in dst.state}
