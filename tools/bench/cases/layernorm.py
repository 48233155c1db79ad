"""vs_torch.py cases for the layernorm group: rmsnorm, gemma_rmsnorm and the fused
residual-add variants (in place on x and residual), in bf16, at Llama-3-8B (H=4096) and
DeepSeek-V3 (H=7168) widths, decode-sized (T=1, 64: CUDA graphs) and large (T=32768).

The torch side is the exact math the kreg ops define (docs/kernels.md): fp32 upcast, one
rounding at the store; the fused ops normalise the unrounded fp32 sum and store the sum,
rounded, into residual.
"""

import torch

EPS = 1e-6
DTYPE = torch.bfloat16
ELEM = 2  # bytes per bf16
WIDTHS = [(4096, "Llama-3-8B"), (7168, "DeepSeek-V3")]
TOKENS = [1, 64, 32768]
SMALL_MAX_T = 64
TOL = (2e-2, 2e-2)  # bf16: one rounding step either way


def _randn(*shape):
    return torch.randn(*shape, device="cuda").to(DTYPE)


def _weight(h, gemma):
    w = 0.1 * torch.randn(h, device="cuda")
    return (w if gemma else 1.0 + w).to(DTYPE)


def _norm(s, w, gemma):
    """rmsnorm of the fp32 tensor s with weight w, rounded once to bf16."""
    scale = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)
    wf = w.float()
    return (s * scale * ((1.0 + wf) if gemma else wf)).to(DTYPE)


def _rmsnorm_case(name, gemma, t, h, model):
    def make():
        return {"x": _randn(t, h), "w": _weight(h, gemma), "out": torch.empty(t, h, dtype=DTYPE, device="cuda")}

    return dict(
        op=f"layernorm.{name}",
        shape=f"T={t} H={h} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, d: op(d["x"], d["w"], d["out"], eps=EPS),
        torch=lambda d: (_norm(d["x"].float(), d["w"], gemma),),
        check=lambda d: (d["out"],),
        tol=TOL,
        bytes=ELEM * (2 * t * h + h),
    )


def _fused_case(name, gemma, t, h, model):
    def make():
        return {"x": _randn(t, h), "residual": _randn(t, h), "w": _weight(h, gemma)}

    def reference(d):
        s = d["x"].float() + d["residual"].float()
        return (_norm(s, d["w"], gemma), s.to(DTYPE))

    return dict(
        op=f"layernorm.{name}",
        shape=f"T={t} H={h} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, d: op(d["x"], d["residual"], d["w"], eps=EPS),
        torch=reference,
        check=lambda d: (d["x"], d["residual"]),  # mutated in place: x <- norm, residual <- sum
        tol=TOL,
        bytes=ELEM * (4 * t * h + h),  # x, residual read and written, weight read
    )


def cases():
    for h, model in WIDTHS:
        for t in TOKENS:
            yield _rmsnorm_case("rmsnorm", False, t, h, model)
            yield _fused_case("fused_add_rmsnorm", False, t, h, model)
            yield _rmsnorm_case("gemma_rmsnorm", True, t, h, model)
            yield _fused_case("gemma_fused_add_rmsnorm", True, t, h, model)
