"""torch_samples for the communication group (merged into torch_samples.BUILDERS at import).

Every samples() call gets a world-of-one comm, reg.create_resource("communication.comm")
with the default parameters (one rank, no store, host-only; it serves CUDA tensors too),
passed as kwargs["comm"]. On one rank all_reduce leaves x unchanged (every reduction of one
value is that value), all_gather and reduce_scatter copy x into out, and
all_reduce_add_rmsnorm is layernorm.fused_add_rmsnorm. out has world_size * numel(x) =
numel(x) elements in any contiguous shape: one sample gives it a flat one.
"""

import torch_samples as base

Sample = base.Sample


def _comm(m):
    return m.resource("communication.comm")


def _all_reduce(m, dt):
    comm = _comm(m)
    return [
        Sample((m.randn(3, 70, dtype=dt),), {"comm": comm}, f"T=3 H=70 sum {base._SHORT[dt]}"),
        Sample((m.randn(1, 256, dtype=dt),), {"comm": comm, "op": "max"}, f"T=1 H=256 max {base._SHORT[dt]}"),
    ]


def _all_gather(m, dt):
    comm = _comm(m)
    return [
        Sample((m.randn(3, 70, dtype=dt), m.empty(210, dtype=dt)), {"comm": comm}, f"[3,70] -> [210] {base._SHORT[dt]}"),
        Sample((m.randn(1, 256, dtype=dt), m.empty(1, 256, dtype=dt)), {"comm": comm}, f"[1,256] {base._SHORT[dt]}"),
    ]


def _reduce_scatter(m, dt):
    comm = _comm(m)
    return [
        Sample((m.randn(3, 70, dtype=dt), m.empty(3, 70, dtype=dt)), {"comm": comm}, f"[3,70] sum {base._SHORT[dt]}"),
        Sample((m.randn(256, dtype=dt), m.empty(256, dtype=dt)), {"comm": comm, "op": "avg"},
               f"[256] avg {base._SHORT[dt]}"),
    ]


def _all_reduce_add_rmsnorm(m, dt):
    comm = _comm(m)
    out = []
    for t, h, kw in ((3, 70, {}), (1, 256, {"eps": 1e-5})):
        w = m.randn(h, dtype=dt, scale=0.1, offset=1.0)
        out.append(Sample((m.randn(t, h, dtype=dt), m.randn(t, h, dtype=dt), w), {"comm": comm, **kw},
                          f"T={t} H={h} {base._SHORT[dt]}"))
    return out


BUILDERS = {
    "communication.all_gather": _all_gather,
    "communication.all_reduce": _all_reduce,
    "communication.all_reduce_add_rmsnorm": _all_reduce_add_rmsnorm,
    "communication.reduce_scatter": _reduce_scatter,
}
