"""torch_samples for the elementwise group (merged into torch_samples.BUILDERS at import):
softcap, sigmoid_gate_mul, add_constant on small [T,H] tensors (H not a multiple of 8,
one-row calls), values past the cap so softcap saturates."""

import torch_samples as base

Sample = base.Sample


def _softcap(m, dt):
    return [
        Sample((m.randn(t, h, dtype=dt, scale=scale), m.empty(t, h, dtype=dt)), kw,
               f"T={t} H={h} {base._SHORT[dt]}")
        for t, h, scale, kw in ((3, 37, 40.0, {"cap": 30.0}), (1, 128, 2.0, {"cap": 1.5}))
    ]


def _sigmoid_gate_mul(m, dt):
    return [
        Sample((m.randn(t, h, dtype=dt), m.randn(t, h, dtype=dt, scale=4.0), m.empty(t, h, dtype=dt)),
               {}, f"T={t} H={h} {base._SHORT[dt]}")
        for t, h in ((3, 37), (1, 128))
    ]


def _add_constant(m, dt):
    return [
        Sample((m.randn(t, h, dtype=dt), m.empty(t, h, dtype=dt)), kw, f"T={t} H={h} {base._SHORT[dt]}")
        for t, h, kw in ((3, 37, {"c": -1.25}), (1, 128, {"c": 0.5}))
    ]


BUILDERS = {
    "elementwise.add_constant": _add_constant,
    "elementwise.sigmoid_gate_mul": _sigmoid_gate_mul,
    "elementwise.softcap": _softcap,
}
