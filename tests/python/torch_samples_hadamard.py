"""torch_samples for quantization.hadamard_transform (merged into torch_samples.BUILDERS at
import): small [T, N] rows, N a power of two (2, 16, 128: the in-thread, shuffle-only sizes
of the CUDA kernel; 1024: one shared-memory exchange), one-row calls, default and explicit
scale."""

import torch_samples as base

Sample = base.Sample


def _hadamard_transform(m, dt):
    return [
        Sample((m.randn(t, n, dtype=dt), m.empty(t, n, dtype=dt)), kw, f"T={t} N={n} {base._SHORT[dt]}")
        for t, n, kw in ((3, 128, {}), (2, 2, {"scale": -1.5}), (1, 1024, {"scale": 1.0 / 32}))
    ]


BUILDERS = {
    "quantization.hadamard_transform": _hadamard_transform,
}
