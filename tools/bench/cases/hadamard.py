"""vs_torch.py cases for quantization.hadamard_transform: out = scale * x @ H_N (Sylvester,
natural order), bf16, scale 1/sqrt(N) (QuaRot/SpinQuant's rotation), at N = 128 (a head),
512, 4096, 8192 (hidden sizes) and 32768 (the largest), large (T = 16384 and 65536 rows) and
decode-sized (T = 1, 64: CUDA graphs).

Target (Dao-AILab's fast-hadamard-transform, which SGLang calls): at most 1.2x the time of a
copy of the same bytes up to N = 8192 at large T. The torch side is the same butterflies
in fp32 (log2(N) elementwise passes: torch has no fast Walsh-Hadamard transform), scaled
and rounded once.
"""

import math

import torch

DTYPE = torch.bfloat16
ELEM = 2
WIDTHS = [128, 512, 4096, 8192, 32768]
TOKENS = [1, 64, 16384, 65536]
SMALL_MAX_T = 64
TOL = (2e-2, 2e-2)  # bf16: one rounding either way of the fp32 value


def _fwht(x):
    """The Walsh-Hadamard butterflies on fp32 rows: stage h turns the pairs (i, i + h) with
    bit h of i clear into (u + v, u - v); all stages give x @ H_N in natural order."""
    t, n = x.shape
    h = 1
    while h < n:
        y = x.view(t, n // (2 * h), 2, h)
        x = torch.stack((y[:, :, 0] + y[:, :, 1], y[:, :, 0] - y[:, :, 1]), dim=2).view(t, n)
        h *= 2
    return x


def _case(t, n):
    scale = 1.0 / math.sqrt(n)

    def make():
        return {
            "x": torch.randn(t, n, device="cuda").to(DTYPE),
            "out": torch.empty(t, n, dtype=DTYPE, device="cuda"),
        }

    def reference(tensors):
        return ((_fwht(tensors["x"].float()) * scale).to(DTYPE),)

    return dict(
        op="quantization.hadamard_transform",
        shape=f"T={t} N={n} bf16",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, tensors: op(tensors["x"], tensors["out"], scale=scale),
        torch=reference,
        check=lambda tensors: (tensors["out"],),
        tol=TOL,
        bytes=ELEM * 2 * t * n,  # x read, out written
    )


def cases():
    for n in WIDTHS:
        for t in TOKENS:
            # 65536 x 32768 is 8 GiB per fp32 intermediate of the torch side: T = 16384 is
            # large enough there.
            if n == 32768 and t == 65536:
                continue
            yield _case(t, n)
