"""Count what a piece of code would wait for on CUDA: copies from the device to the host, and host reads.

`TransferMode` follows where each tensor would live on a CUDA rank (its docstring gives the design) and counts,
by (path, function, op), every device-to-host copy and every read of a device value on the host: what
tests/trainer/test_step_host_reads.py asserts per step for each store configuration.  `host_reads` is the older,
coarser count of the `.item()` / `.tolist()` / `.cpu()` calls a piece of code makes, device or host alike, by
line; the project marks each intended one with a `# host read:` comment on the line or the line before
(trainer/train.py's docstring lists them).
"""

from __future__ import annotations

import contextlib
import linecache
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "storage")
METHODS = ("item", "tolist", "cpu")
MARK = "# host read:"


@contextlib.contextmanager
def host_reads(packages: tuple[str, ...] = PACKAGES) -> Iterator[Counter[tuple[str, int, str]]]:
    """Within the block, count each call of `METHODS` made from the project's `packages`, by
    (path relative to the repo, line, method)."""
    seen: Counter[tuple[str, int, str]] = Counter()
    roots = tuple(str(REPO / p) + "/" for p in packages)
    originals = {name: getattr(torch.Tensor, name) for name in METHODS}

    def wrap(name: str):
        original = originals[name]

        def counted(self, *args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(roots):
                seen[(str(Path(caller.f_code.co_filename).relative_to(REPO)), caller.f_lineno, name)] += 1
            return original(self, *args, **kwargs)

        return counted

    for name in METHODS:
        setattr(torch.Tensor, name, wrap(name))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


def unmarked(seen: Counter[tuple[str, int, str]]) -> list[str]:
    """The call sites of `seen` without a `# host read:` comment on their line or the line before."""
    out = []
    for path, line, name in seen:
        text = linecache.getline(str(REPO / path), line) + linecache.getline(str(REPO / path), line - 1)
        if MARK not in text:
            out.append(f"{path}:{line} .{name}()")
    return out


SIM_DEVICE = torch.device("cpu", 0)
"""The training device of a simulated GPU rank on a CPU: `cpu:0` computes on the CPU like `cpu`, but compares
unequal to the host's `torch.device("cpu")`, so code that places tensors by the device it is given (the store's
`device`, `ctx.device`, `ctx.comm_device`) says through it where a CUDA rank would put them (`TransferMode`)."""

TRANSFER_HELPERS = ("storage/embedding/rows/transfer.py",)
"""Files whose calls are charged to their caller: the one copy helper is not where a transfer is decided."""

SYNC_OPS = frozenset(
    {
        "item",
        "tolist",
        "numpy",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__complex__",
        "__format__",
        "is_nonzero",
        "equal",
        "allclose",
        "nonzero",
        "argwhere",
        "masked_select",
        "unique",
        "unique_consecutive",
        "bincount",
        "repeat_interleave",
    }
)
"""Ops that read a device value on the host, or make a shape that depends on one (on CUDA: a wait for the GPU)."""
IN_PLACE_DUNDERS = frozenset({"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ior__", "__iand__"})
_MARK = "_ctr_on_device"
"""The attribute that marks a tensor as living on the (simulated) training device."""


def _on_device(t: object) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, _MARK, False)


def _mark(out: object, on_device: bool) -> None:
    for t in tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            setattr(t, _MARK, on_device)


def _bool_index(index: object) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class TransferMode(TorchFunctionMode):
    """Count, by (path relative to the repo, function, op), each device-to-host copy and each host read of a
    device value that the code under it makes: what a CUDA rank would wait for, counted on a CPU.

    The design.  On a CPU every tensor is a CPU tensor, so `t.device` cannot say which ones a CUDA rank would
    hold on the GPU.  What the code *intends* can: it places tensors by the devices it is given, never by
    guessing.  So the rank runs with its training device (and, for NCCL, its communication device) set to
    `SIM_DEVICE` (`cpu:0`: real CPU memory, unequal to the host's `cpu`), and this mode, which sees every torch
    call and `Tensor` method (`torch.overrides.TorchFunctionMode`: nothing is patched), follows each tensor's
    residency from its birth:

    - on the device: the result of a factory given `device=SIM_DEVICE` (the device tier's buffers, the
      reader's batch staged for the step), of `.to(SIM_DEVICE)` (a host-to-device copy: a new tensor, as on
      CUDA), and of any op with an input on the device (the model's activations and gradients, the rows a
      device tier gathers); a `.grad` or `.data` follows its tensor, a `param.data = t` follows `t`, and its
      `.device` reads `SIM_DEVICE`, so `x.to(t.device)` puts `x` beside `t`;
    - on the host: everything else: `torch.from_numpy` (the store's key index, the host tier's rows),
      factories without a device, and the result of `.cpu()` / `.to("cpu")` / `.to(host_tensor)` (a copy,
      unmarked, so the host code after it is not charged).

    Counted (`op`): `d2h:<method>`: a copy from a device tensor to the host, by `.cpu()`, `.to(host)`, or an
    in-place op that writes device values into a host tensor (`copy_`, `t[i] = x`, `index_copy_`, ...);
    `d2h-async:<method>` when given `non_blocking=True` (queued; the host must still wait before reading it);
    `sync:<op>`: a device value read on the host (`.item()`, `.tolist()`, `.numpy()`, `bool()`, `int()`,
    `torch.equal`, ...), an op whose output shape depends on device values (`nonzero`, `unique`,
    `masked_select`, `bincount`, `repeat_interleave` without `output_size`), or a boolean-mask index of a
    device tensor (`sync:[mask]`).  A read of a host tensor costs the GPU nothing and is not counted, so no
    allow-list of host-side reads is needed.  Each call is charged to the innermost frame in the project's
    `packages` (a read inside torch or NumPy goes to the project line that called it), skipping the copy
    helper (`TRANSFER_HELPERS`) so that its caller is named.

    What it cannot see: a branch on `device.type` takes its CPU arm (`cpu:0` is a CPU): the store and the
    sharded embedding test devices with `rows.transfer.is_host`, which tells `cpu:0` from the host; the model's
    attention (`attention_cpu.in_use`) runs its CPU kernel, with no transfers either way.  Costs a CUDA run has
    and a count cannot show (a pageable host-to-device copy's wait, a kernel's own syncs) are what `make
    gpu-check` runs under `torch.cuda.set_sync_debug_mode("error")`.

    Example::

        with TransferMode() as seen:
            store = open_store(spec, ctx)      # ctx.device = SIM_DEVICE
            trainer = Trainer(spec, ctx=ctx, store=store, step_hooks=[lambda info: steps.append(seen.take())])
            trainer.train()
    """

    def __init__(self, device: torch.device = SIM_DEVICE, packages: tuple[str, ...] = PACKAGES) -> None:
        super().__init__()
        self.device = device
        self.roots = tuple(str(REPO / p) + "/" for p in packages)
        self.helpers = tuple(str(REPO / p) for p in TRANSFER_HELPERS)
        self.seen: Counter[tuple[str, str, str]] = Counter()

    def take(self) -> Counter[tuple[str, str, str]]:
        """The transfers counted since the last `take`, and start counting afresh."""
        seen, self.seen = self.seen, Counter()
        return seen

    def _count(self, op: str) -> None:
        frame = sys._getframe(1)  # this file is not in `packages`: the walk passes it
        while frame is not None and (
            not frame.f_code.co_filename.startswith(self.roots) or frame.f_code.co_filename in self.helpers
        ):
            frame = frame.f_back
        if frame is not None:
            self.seen[(str(Path(frame.f_code.co_filename).relative_to(REPO)), frame.f_code.co_name, op)] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's protocol
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        owner = getattr(getattr(func, "__self__", None), "__name__", "")  # a getset descriptor's attribute
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        device_in = any(_on_device(t) for t in tensors)
        first = args[0] if args else None
        if name in ("to", "cpu") and isinstance(first, torch.Tensor):
            return self._to(func, name, first, args, kwargs)
        if name in SYNC_OPS and device_in and not (name == "repeat_interleave" and "output_size" in kwargs):
            self._count(f"sync:{name}")
        if name in ("__getitem__", "__setitem__") and _on_device(first) and _bool_index(args[1]):
            self._count("sync:[mask]")
        out = func(*args, **kwargs)
        if name == "__get__" and owner == "device":  # `x.to(t.device)` puts x where t lives
            return self.device if _on_device(first) else out
        if name == "__set__" and owner == "data":  # param.data = t: the parameter now lives where t does
            _mark(first, _on_device(args[1]))
            return out
        target = kwargs.get("out")
        if target is None and isinstance(first, torch.Tensor) and self._in_place(name):
            target = first
        if target is not None:  # written in place: stays where it is; device values into a host tensor are copied
            others = [t for t in tensors if t is not target]
            if not any(_on_device(t) for t in tree_flatten(target)[0]) and any(_on_device(t) for t in others):
                self._count(("d2h-async:" if kwargs.get("non_blocking") else "d2h:") + name)
            return out
        device = kwargs.get("device")
        if device is not None:
            _mark(out, torch.device(device) == self.device)
        else:
            _mark(out, device_in)
        return out

    @staticmethod
    def _in_place(name: str) -> bool:
        return name in IN_PLACE_DUNDERS or (name.endswith("_") and not name.startswith("__"))

    def _to(self, func, name: str, src: torch.Tensor, args: tuple, kwargs: dict):  # noqa: ANN001, ANN205
        """`.cpu()` / `.to(...)`: where the copy goes, counted when it leaves the device."""
        if name == "cpu":
            dest_on_device, non_blocking = False, False
        else:
            other = next((a for a in (*args[1:], *kwargs.values()) if isinstance(a, torch.Tensor)), None)
            device, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if other is not None:
                dest_on_device = _on_device(other)
            elif device is None:  # a dtype or layout change: stays where it is
                dest_on_device = _on_device(src)
            else:
                dest_on_device = torch.device(device) == self.device
        out = func(*args, **kwargs)
        if _on_device(src) and not dest_on_device:
            self._count(("d2h-async:" if non_blocking else "d2h:") + name)
            out = out.clone() if out is src else out  # a new host tensor, as on CUDA
        elif dest_on_device and not _on_device(src) and out is src:
            out = out.clone()
        _mark(out, dest_on_device)
        return out
