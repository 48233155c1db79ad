"""vs_torch.py cases for the elementwise group: softcap (cap 30, Gemma 2's final logits),
sigmoid_gate_mul and add_constant in bf16 at the issue's target shape (32768 x 8192,
against copy bandwidth) and decode sizes (T = 1, 16, 64 at H = 4096: CUDA graphs).

Every op computes in fp32 and rounds once at the store (docs/ops/elementwise.md); the
torch references do the same from upcast inputs.
"""

import torch

DTYPE = torch.bfloat16
ELEM = 2
SHAPES = [(1, 4096), (16, 4096), (64, 4096), (32768, 8192)]
SMALL_MAX_T = 64
TOL = (2e-2, 2e-2)
CAP = 30.0
C = 0.5


def _case(name, t, h):
    binary = name == "sigmoid_gate_mul"

    def make():
        d = {"x": (torch.randn(t, h, device="cuda") * 40.0).to(DTYPE)}
        if binary:
            d["gate"] = (torch.randn(t, h, device="cuda") * 4.0).to(DTYPE)
        d["out"] = torch.empty(t, h, dtype=DTYPE, device="cuda")
        return d

    def reference(tensors):
        x = tensors["x"].float()
        if name == "softcap":
            y = CAP * torch.tanh(x / CAP)
        elif binary:
            y = x * torch.sigmoid(tensors["gate"].float())
        else:
            y = x + C
        return (y.to(DTYPE),)

    if name == "softcap":
        call = lambda op, d: op(d["x"], d["out"], cap=CAP)  # noqa: E731
    elif binary:
        call = lambda op, d: op(d["x"], d["gate"], d["out"])  # noqa: E731
    else:
        call = lambda op, d: op(d["x"], d["out"], c=C)  # noqa: E731

    return dict(
        op=f"elementwise.{name}",
        shape=f"T={t} H={h} bf16",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=call,
        torch=reference,
        check=lambda tensors: (tensors["out"],),
        tol=TOL,
        bytes=ELEM * (3 if binary else 2) * t * h,  # inputs read once, out written once
    )


def cases():
    for t, h in SHAPES:
        for name in ("softcap", "sigmoid_gate_mul", "add_constant"):
            yield _case(name, t, h)
