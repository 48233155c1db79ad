"""torch_samples for the grammar group (merged into torch_samples.BUILDERS at import):
apply_token_bitmask on small logits, V not a multiple of 32, a bitmask wider than
needed, with and without indices (in range: the CPU reference refuses others)."""

import torch

import torch_samples as base

Sample = base.Sample


def _mask(m, b, w):
    return m.randint(-(2**31), 2**31, b, w, dtype=torch.int32)


def _apply_token_bitmask(m, dt):
    short = base._SHORT[dt]
    return [
        Sample((m.randn(3, 70, dtype=dt), _mask(m, 3, 3), None), {}, f"B=3 V=70 W=3 {short}"),
        Sample((m.randn(4, 64, dtype=dt), _mask(m, 4, 5), m.tensor([2, 0], torch.int32)), {},
               f"B=4 V=64 W=5 indices=[2,0] {short}"),
        Sample((m.randn(2, 33, dtype=dt), _mask(m, 2, 2), m.tensor([1], torch.int32)), {},
               f"B=2 V=33 W=2 indices=[1] {short}"),
    ]


BUILDERS = {"grammar.apply_token_bitmask": _apply_token_bitmask}
