"""vs_torch.py cases for the quantization group (hadamard_transform: hadamard.py): bf16
activations to FP8 E4M3 at DeepSeek-V3's widths (H = 7168 for the group and per-token
ops; the fused silu form at its MoE intermediate 2048 and dense 18432), decode-sized (T =
1, 64: CUDA graphs) and large (T = 32768, the target: >= 90% of copy bandwidth).

The torch side is the contract written in torch: s = max(amax, eps) / 448 in fp32, q =
clamp(x / s, +-448) rounded to e4m3 (torch's float8 conversion rounds to nearest even);
codes compare as floats. Two things in it are spelled to stay exact:

- every division is by a CUDA tensor (_div). torch turns `tensor / python_float` into a
  multiplication by the rounded reciprocal (its "CPU scalar" fast path), so s was
  max(amax, eps) * RN(1/448), an ulp off the contract's correctly rounded quotient for
  some amax; the codes then moved by one e4m3 step wherever x / s sat next to a rounding
  boundary (the MISMATCH rows of one step, e.g. 352 vs 320). Tensor / tensor is IEEE
  division.
- the UE8M0 scale is taken on the bits (_pow2_at_least), as quant_math.hpp does: exp2(
  ceil(log2(s))) gives the power below s when log2 rounds a value just above a power of
  two down to the integer.

The fused form stays approximate: torch's fp32 silu (its own exp) may differ from the
op's exp_f by an ulp, which can move a code by one step; FUSED allows exactly one step
(rtol 1/8 covers a step of a normal code, atol 2^-9 that of a subnormal one).
"""

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
ELEM = 2
TOKENS = [1, 64, 32768]
SMALL_MAX_T = 64
FP8_MAX = 448.0
EPS = 1e-10
EXACT = (0.0, 0.0)
FUSED = (2.0 ** -9, 0.13)

_CONSTANTS = {}


def _fp8():
    return torch.float8_e4m3fn


def _div(a, d):
    """a / d with IEEE division: d as a 0-d CUDA tensor, made once (not a python float,
    which torch replaces by a multiplication by 1/d)."""
    c = _CONSTANTS.get((d, a.device))
    if c is None:
        c = _CONSTANTS[(d, a.device)] = torch.tensor(d, dtype=torch.float32, device=a.device)
    return a / c


def _pow2_at_least(s):
    """The smallest power of two >= s (s > 0 finite), on the bits: quant_math.hpp's
    round_up_pow2 for normal s (eps keeps s normal here)."""
    u = s.view(torch.int32)
    exp = u & 0x7F800000
    man = u & 0x007FFFFF
    return torch.where(man == 0, u, exp + 0x00800000).view(torch.float32)


def _group_ref(y, gs, ue8m0):
    t, h = y.shape
    g = y.view(t, h // gs, gs)
    s = _div(g.abs().amax(dim=-1).clamp_min(EPS), FP8_MAX)
    if ue8m0:
        s = _pow2_at_least(s)
    q = (g / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(_fp8()).view(t, h)
    return q, s


def _group_case(t, h, silu, col_major, ue8m0, model):
    gs = 128
    g = h // gs
    p = (t + 3) // 4 * 4

    def make():
        x = torch.randn(t, 2 * h if silu else h, device="cuda").to(DTYPE)
        s = torch.empty(g, p, device="cuda") if col_major else torch.empty(t, g, device="cuda")
        return {"x": x, "out": torch.empty(t, h, dtype=_fp8(), device="cuda"), "scales": s}

    def reference(tensors):
        xf = tensors["x"].float()
        y = F.silu(xf[:, :h]) * xf[:, h:] if silu else xf
        q, s = _group_ref(y, gs, ue8m0)
        return q.float(), s

    def check(tensors):
        s = tensors["scales"][:, :t].t() if col_major else tensors["scales"]
        return tensors["out"].float(), s

    name = ("silu_and_mul_" if silu else "") + "per_token_group_quant_fp8" + (
        "_col_major" if col_major else "")
    x_bytes = ELEM * t * (2 * h if silu else h)
    return dict(
        op=f"quantization.{name}",
        shape=f"T={t} H={h} gs={gs}{' ue8m0' if ue8m0 else ''} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, tensors: op(tensors["x"], tensors["out"], tensors["scales"],
                                    group_size=gs, eps=EPS, scale_ue8m0=ue8m0),
        torch=reference,
        check=check,
        tol=FUSED if silu else EXACT,
        bytes=x_bytes + t * h + 4 * t * g,  # x read; codes and scales written
    )


def _int8_case(t, h):
    gs = 128

    def make():
        return {"x": torch.randn(t, h, device="cuda").to(DTYPE),
                "out": torch.empty(t, h, dtype=torch.int8, device="cuda"),
                "scales": torch.empty(t, h // gs, device="cuda")}

    def reference(tensors):
        g = tensors["x"].float().view(t, h // gs, gs)
        s = _div(g.abs().amax(dim=-1).clamp_min(EPS), 127.0)
        q = torch.round((g / s.unsqueeze(-1)).clamp(-127, 127)).to(torch.int8).view(t, h)
        return q, s

    return dict(
        op="quantization.per_token_group_quant_int8",
        shape=f"T={t} H={h} gs={gs} bf16 (DeepSeek-V3)",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, tensors: op(tensors["x"], tensors["out"], tensors["scales"],
                                    group_size=gs, eps=EPS),
        torch=reference,
        check=lambda tensors: (tensors["out"], tensors["scales"]),
        tol=EXACT,
        bytes=ELEM * t * h + t * h + 4 * t * (h // gs),
    )


def _token_case(t, h):
    def make():
        return {"x": torch.randn(t, h, device="cuda").to(DTYPE),
                "out": torch.empty(t, h, dtype=_fp8(), device="cuda"),
                "scales": torch.empty(t, device="cuda")}

    def reference(tensors):
        xf = tensors["x"].float()
        s = _div(xf.abs().amax(dim=-1).clamp_min(EPS), FP8_MAX)
        return (xf / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(_fp8()).float(), s

    return dict(
        op="quantization.per_token_quant_fp8",
        shape=f"T={t} H={h} bf16 (DeepSeek-V3)",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, tensors: op(tensors["x"], tensors["out"], tensors["scales"]),
        torch=reference,
        check=lambda tensors: (tensors["out"].float(), tensors["scales"]),
        tol=EXACT,
        bytes=ELEM * t * h + t * h + 4 * t,
    )


def _tensor_case(t, h, is_static):
    def make():
        x = torch.randn(t, h, device="cuda").to(DTYPE)
        scale = torch.full((1,), 0.0125, device="cuda") if is_static else torch.empty(1, device="cuda")
        return {"x": x, "out": torch.empty(t, h, dtype=_fp8(), device="cuda"), "scale": scale}

    def reference(tensors):
        xf = tensors["x"].float()
        s = (tensors["scale"].clone() if is_static
             else _div(xf.abs().amax().clamp_min(EPS), FP8_MAX).reshape(1))
        return (xf / s).clamp(-FP8_MAX, FP8_MAX).to(_fp8()).float(), s

    return dict(
        op="quantization.per_tensor_quant_fp8",
        shape=f"T={t} H={h} {'static' if is_static else 'dynamic'} bf16",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, tensors: op(tensors["x"], tensors["out"], tensors["scale"],
                                    is_static=is_static),
        torch=reference,
        check=lambda tensors: (tensors["out"].float(), tensors["scale"]),
        tol=EXACT,
        # dynamic: x is read twice (max, then quantize) unless it stays in L2; the fewest
        # bytes are one read
        bytes=ELEM * t * h + t * h + 4,
    )


def cases():
    for t in TOKENS:
        yield _group_case(t, 7168, False, False, False, "DeepSeek-V3")
        yield _group_case(t, 7168, False, False, True, "DeepSeek-V3")
        yield _group_case(t, 7168, False, True, True, "DeepSeek-V3")
        yield _group_case(t, 2048, True, False, False, "DeepSeek-V3 MoE")
        yield _group_case(t, 18432, True, True, False, "DeepSeek-V3 dense")
        yield _int8_case(t, 7168)
        yield _token_case(t, 7168)
        yield _tensor_case(t, 7168, False)
        yield _tensor_case(t, 7168, True)
