"""torch_samples for the sampling group (merged into torch_samples.BUILDERS at import):
softmax rows of awkward widths (V not a multiple of 8, one-row batches), top_k / top_p /
min_p values that cut, keep all (0, V, 1.0) or keep one, and a (seed, offset) rng tensor
the sampling ops advance. probs are always float32 (the group's one dtype): `dt` is
ignored."""

import torch

import torch_samples as base

Sample = base.Sample


def _probs(m, b, v):
    return m.to(torch.softmax(m.randn(b, v, scale=3.0).cpu(), dim=-1))


def _top_k_renorm(m, dt):
    return [
        Sample((_probs(m, b, v), m.tensor(ks, torch.int32), m.empty(b, v, dtype=torch.float32)), {},
               f"B={b} V={v}")
        for b, v, ks in ((3, 37, [5, 0, 1]), (1, 130, [40]))
    ]


def _top_p_renorm(m, dt):
    return [
        Sample((_probs(m, b, v), m.tensor(ps, torch.float32), m.empty(b, v, dtype=torch.float32)), {},
               f"B={b} V={v}")
        for b, v, ps in ((3, 37, [0.5, 1.0, 0.9]), (1, 130, [0.75]))
    ]


def _top_k_top_p(m, dt):
    return [
        Sample((_probs(m, b, v), m.tensor(ks, torch.int32), m.tensor(ps, torch.float32),
                m.empty(b, dtype=torch.int32), m.tensor([seed, 0], torch.int64)), {}, f"B={b} V={v}")
        for b, v, ks, ps, seed in ((3, 37, [5, 0, 1], [0.8, 1.0, 0.5], 7), (1, 130, [40], [0.9], 11))
    ]


def _min_p(m, dt):
    return [
        Sample((_probs(m, b, v), m.tensor(ps, torch.float32), m.empty(b, dtype=torch.int32),
                m.tensor([seed, 3], torch.int64)), {}, f"B={b} V={v}")
        for b, v, ps, seed in ((3, 37, [0.1, 0.0, 1.0], 5), (1, 130, [0.05], 9))
    ]


BUILDERS = {
    "sampling.min_p_sampling_from_probs": _min_p,
    "sampling.top_k_renorm_probs": _top_k_renorm,
    "sampling.top_k_top_p_sampling_from_probs": _top_k_top_p,
    "sampling.top_p_renorm_probs": _top_p_renorm,
}
