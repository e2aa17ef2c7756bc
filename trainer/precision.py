"""Mixed precision of the dense network (`trainer.precision`): autocast, master weights in float32.

- `fp32`: nothing changes (the CPU default: the bit-identical tests run it).
- `bf16` (the CUDA default): the model's forward runs under `torch.autocast` in bfloat16; its
  parameters, their gradients, the dense Adam state and the embedding store stay float32 (autocast
  casts per op; the rows' gradients come back float32 because the rows are float32 leaves).
  bfloat16 has float32's exponent range, so no loss scaling.  It also runs on CPU.
- `fp16`: float16 autocast with dynamic loss scaling (`torch.amp.GradScaler`): the loss is scaled
  before backward; the dense gradients are unscaled by the scaler, which skips the Adam step of an
  overflowed step and lowers the scale; the rows' gradients are unscaled here and their non-finite
  entries zeroed, because the push is a collective that every rank must make.  The scaler reads its
  scale and overflow flag on the host each step: fp16 costs those host reads, bf16 none.

The loss itself is computed in float32 from the logits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from trainer.config import PRECISIONS
from trainer.optim.kstep_adam import KStepAdam

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(requested: str, device_type: str) -> str:
    """`trainer.precision` for a device: `auto` is bf16 on CUDA, fp32 elsewhere.

    Raises:
        ValueError: an unknown precision.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"trainer.precision must be one of {PRECISIONS}, got {requested!r}")
    if requested == "auto":
        return "bf16" if device_type == "cuda" else "fp32"
    return requested


class Precision:
    """The autocast context and loss scaling of one rank's steps.

    Args:
        name: `fp32`, `bf16` or `fp16` (resolved: `resolve_precision`).
        device: the training device.

    Example::

        prec = Precision("bf16", device)
        with prec.autocast():
            logits = model(dense, emb)
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels)
        prec.backward(loss)
        row_grads = prec.unscale(rows.grad)
        prec.step(opt)
    """

    def __init__(self, name: str, device: torch.device) -> None:
        if name not in ("fp32", *DTYPES):
            raise ValueError(f"precision must be fp32, bf16 or fp16 (resolved), got {name!r}")
        self.name, self.device = name, device
        self.dtype = DTYPES.get(name, torch.float32)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward's context: autocast to `dtype` (nothing for fp32)."""
        if self.name == "fp32":
            yield
            return
        with torch.autocast(device_type=self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, grad: torch.Tensor) -> torch.Tensor:
        """A leaf's gradient without the loss scale; fp16's overflowed entries become 0 (see the module)."""
        if self.scaler is None:
            return grad
        scale = self.scaler.get_scale()  # host read: fp16's loss scale (see the module docstring)
        return torch.nan_to_num(grad.float() / scale, nan=0.0, posinf=0.0, neginf=0.0)

    def step(self, opt: KStepAdam) -> None:
        """The dense optimizer's step (through the scaler for fp16: skipped when its gradients overflowed)."""
        if self.scaler is None:
            opt.step()
            return
        opt.step(scaler=self.scaler)
        self.scaler.update()
