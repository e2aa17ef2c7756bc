"""`FusedAdam` steps exactly as `torch.optim.Adam(fused=True)` does, without importing torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from trainer.optim.fused_adam import FusedAdam


def _pair(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 1))
    twin = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 1))
    twin.load_state_dict(net.state_dict())
    return net, twin


def _groups(net: nn.Module) -> list[dict]:
    first, second = list(net[0].parameters()), list(net[2].parameters())
    return [{"params": first, "lr": 0.01, "lr_scale": 1.0}, {"params": second, "lr": 0.005, "lr_scale": 0.5}]


def test_steps_are_bit_equal_to_torch_fused_adam_through_lr_changes_and_a_parameter_without_a_gradient() -> None:
    ours_net, ref_net = _pair()
    kw = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
    ours = FusedAdam(_groups(ours_net), **kw)
    ref = torch.optim.Adam(_groups(ref_net), **kw, fused=True)
    assert [g["lr_scale"] for g in ours.param_groups] == [1.0, 0.5]
    g = torch.Generator().manual_seed(1)
    for step in range(1, 9):
        for group in (*ours.param_groups, *ref.param_groups):
            group["lr"] = 0.01 * group["lr_scale"] * (1 - step / 20)
        x = torch.randn(16, 6, generator=g)
        for net, opt in ((ours_net, ours), (ref_net, ref)):
            opt.zero_grad(set_to_none=False)
            net(x).square().mean().backward()
            if step % 3 == 0:  # the last bias gets no gradient this step: neither its moments nor its step move
                net[2].bias.grad = None
            opt.step()
    for (name, p), q in zip(ours_net.named_parameters(), ref_net.parameters(), strict=True):
        assert torch.equal(p, q), name
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours.state[p][key], ref.state[q][key]), (name, key)
    assert float(ours.state[ours_net[2].bias]["step"]) == 6.0  # steps 3 and 6 had no gradient for it


def test_under_a_loss_scaler_an_overflowed_step_is_skipped_as_torch_skips_it() -> None:
    ours_net, ref_net = _pair(2)
    kw = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8}
    ours, ref = FusedAdam(_groups(ours_net), **kw), torch.optim.Adam(_groups(ref_net), **kw, fused=True)
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**8) for _ in range(2)]
    g = torch.Generator().manual_seed(4)
    for step in range(1, 6):
        x = torch.randn(8, 6, generator=g)
        if step == 3:
            x[0, 0] = float("inf")  # an overflow: the scaler skips this step and halves its scale
        for net, opt, scaler in ((ours_net, ours, scalers[0]), (ref_net, ref, scalers[1])):
            opt.zero_grad(set_to_none=False)
            scaler.scale(net(x).mean()).backward()
            scaler.step(opt)  # type: ignore[arg-type]  # FusedAdam is an optimizer by its duck type
            scaler.update()
    assert scalers[0].get_scale() == scalers[1].get_scale() < 2.0**8
    for (name, p), q in zip(ours_net.named_parameters(), ref_net.parameters(), strict=True):
        assert torch.equal(p, q), name
        assert float(ours.state[p]["step"]) == float(ref.state[q]["step"]) == 4.0, name


@pytest.mark.subprocess  # a fresh interpreter: what a rank has imported
def test_making_and_stepping_it_imports_no_torch_dynamo() -> None:
    code = (
        "import sys, torch\n"
        "from trainer.optim.fused_adam import FusedAdam\n"
        "p = torch.nn.Parameter(torch.ones(3))\n"
        "opt = FusedAdam([{'params': [p]}], lr=0.1, betas=(0.9, 0.999), eps=1e-8)\n"
        "p.sum().backward(); opt.step(); opt.zero_grad(set_to_none=False)\n"
        "assert float(p[0]) < 1.0\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
