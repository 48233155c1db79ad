"""vs_torch.py cases for the activation group: silu/gelu/gelu_tanh_and_mul in bf16 at the
Llama-3-8B (intermediate 14336) and DeepSeek-V3 (intermediate 18432) MLP widths,
decode-sized (T=1, 64: CUDA graphs) and large (T=32768).

x is [T, 2*D] (gate then up), out is [T, D] = act(gate) * up, computed in fp32 and rounded
once (docs/kernels.md).
"""

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
ELEM = 2
WIDTHS = [(14336, "Llama-3-8B"), (18432, "DeepSeek-V3")]
TOKENS = [1, 64, 32768]
SMALL_MAX_T = 64
TOL = (2e-2, 2e-2)

ACTS = {
    "silu_and_mul": F.silu,
    "gelu_and_mul": lambda a: F.gelu(a, approximate="none"),
    "gelu_tanh_and_mul": lambda a: F.gelu(a, approximate="tanh"),
}


def _case(name, act, t, d, model):
    def make():
        return {
            "x": torch.randn(t, 2 * d, device="cuda").to(DTYPE),
            "out": torch.empty(t, d, dtype=DTYPE, device="cuda"),
        }

    def reference(tensors):
        xf = tensors["x"].float()
        return ((act(xf[:, :d]) * xf[:, d:]).to(DTYPE),)

    return dict(
        op=f"activation.{name}",
        shape=f"T={t} D={d} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, tensors: op(tensors["x"], tensors["out"]),
        torch=reference,
        check=lambda tensors: (tensors["out"],),
        tol=TOL,
        bytes=ELEM * 3 * t * d,  # x [T, 2D] read, out [T, D] written
    )


def cases():
    for d, model in WIDTHS:
        for t in TOKENS:
            for name, act in ACTS.items():
                yield _case(name, act, t, d, model)
