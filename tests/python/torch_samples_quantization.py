"""torch_samples for the quantization group (merged into torch_samples.BUILDERS at import),
all but hadamard_transform (torch_samples_hadamard.py): per-token-group quantization with
group sizes 128, 64 and 16 (16: H = 48, not a multiple of 128), one-token calls, UE8M0
scales, column-major scales with TMA padding (P = T rounded up to 4), the fused silu form,
int8, per-token and per-tensor (static and dynamic).

FP8 outputs need torch.float8_e4m3fn (torch >= 2.1): with an older torch (Debian 12's
1.13) building an FP8 op's samples skips the calling pytest test, saying why (kreg refuses
a uint8 stand-in as the wrong dtype)."""

import torch

import torch_samples as base

Sample = base.Sample


def _f8():
    f8 = base._fp8()
    if f8 is None:
        import pytest

        pytest.skip(f"torch {torch.__version__} has no float8_e4m3fn: the FP8 quantization "
                    "samples need torch >= 2.1")
    return f8


def _group(m, dt, silu=False, col_major=False, int8=False):
    out = []
    # (T, H, group_size, ue8m0)
    cases = ((3, 256, 128, False), (1, 128, 64, not int8), (5, 48, 16, False))
    for t, h, gs, ue8m0 in cases:
        g = h // gs
        x = m.randn(t, 2 * h if silu else h, dtype=dt)
        q = m.empty(t, h, dtype=torch.int8 if int8 else _f8())
        p = (t + 3) // 4 * 4
        s = m.empty(g, p, dtype=torch.float32) if col_major else m.empty(t, g, dtype=torch.float32)
        kw = {"group_size": gs, "eps": 1e-10}
        if not int8:
            kw["scale_ue8m0"] = ue8m0
        name = f"T={t} H={h} gs={gs}{' ue8m0' if ue8m0 else ''} {base._SHORT[dt]}"
        out.append(Sample((x, q, s), kw, name))
    return out


def _per_token(m, dt):
    out = []
    for t, h in ((4, 128), (1, 37), (3, 1000)):
        out.append(Sample((m.randn(t, h, dtype=dt), m.empty(t, h, dtype=_f8()),
                           m.empty(t, dtype=torch.float32)), {}, f"T={t} H={h} {base._SHORT[dt]}"))
    return out


def _per_tensor(m, dt):
    out = []
    for t, h, static in ((4, 128, False), (3, 37, True), (1, 8, False)):
        # dynamic: a stale scale the op replaces (the tensor is read and written)
        scale = m.tensor([0.0125 if static else 3.0], torch.float32)
        out.append(Sample((m.randn(t, h, dtype=dt), m.empty(t, h, dtype=_f8()), scale),
                          {"is_static": static},
                          f"T={t} H={h} {'static' if static else 'dynamic'} {base._SHORT[dt]}"))
    return out


_Q = "quantization."
BUILDERS = {
    _Q + "per_token_group_quant_fp8": lambda m, dt: _group(m, dt),
    _Q + "per_token_group_quant_fp8_col_major": lambda m, dt: _group(m, dt, col_major=True),
    _Q + "silu_and_mul_per_token_group_quant_fp8": lambda m, dt: _group(m, dt, silu=True),
    _Q + "silu_and_mul_per_token_group_quant_fp8_col_major":
        lambda m, dt: _group(m, dt, silu=True, col_major=True),
    _Q + "per_token_group_quant_int8": lambda m, dt: _group(m, dt, int8=True),
    _Q + "per_token_quant_fp8": _per_token,
    _Q + "per_tensor_quant_fp8": _per_tensor,
}
