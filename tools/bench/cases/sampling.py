"""vs_torch.py cases for the sampling group at the Llama-3 vocabulary (V = 128256), B = 1
(one decode token: the <= 30 us target) and B = 256, all decode-sized (CUDA-graph
replays). The torch side is the usual sort-based filter (torch.sort, cumsum, scatter) and,
for the sampling ops, torch.multinomial.

Sampled ids cannot equal torch's draws, so the sampling cases compare membership: both
sides return, per row, whether the id lies in the filtered set computed by the torch
filter (all True). Renorm cases compare values; a token exactly at a top-p boundary may
differ between torch's fp32 cumsum and kreg's exact fixed-point sums
(docs/ops/sampling.md), hence the absolute tolerance.
"""

import torch

V = 128256
BATCHES = [1, 256]
TOL = (1e-3, 1e-3)


def _probs(b):
    return torch.softmax(torch.randn(b, V, device="cuda") * 2.0, dim=-1)


def _top_k_mask(probs, k):
    sorted_p, idx = probs.sort(dim=-1, descending=True, stable=True)
    keep = torch.arange(V, device=probs.device)[None, :] < k[:, None].long()
    return torch.zeros_like(probs, dtype=torch.bool).scatter(1, idx, keep)


def _top_p_mask(probs, p):
    sorted_p, idx = probs.sort(dim=-1, descending=True, stable=True)
    total = sorted_p.sum(dim=-1, keepdim=True)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
    keep = before < p[:, None] * total
    return torch.zeros_like(probs, dtype=torch.bool).scatter(1, idx, keep)


def _renorm(probs, mask):
    kept = probs * mask
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_k_top_p_mask(probs, k, p):
    mask = _top_k_mask(probs, k)
    return mask & _top_p_mask(probs * mask, p)


def _min_p_mask(probs, min_p):
    return probs >= min_p[:, None] * probs.max(dim=-1, keepdim=True).values


def _sample(probs, mask):
    ids = torch.multinomial(probs * mask, 1)
    return mask.gather(1, ids).squeeze(1)


def _case(name, b):
    def make():
        t = {
            "probs": _probs(b),
            "top_k": torch.full((b,), 50, dtype=torch.int32, device="cuda"),
            "top_p": torch.full((b,), 0.9, dtype=torch.float32, device="cuda"),
            "min_p": torch.full((b,), 0.05, dtype=torch.float32, device="cuda"),
            "rng": torch.tensor([1234, 0], dtype=torch.int64, device="cuda"),
        }
        if name.endswith("renorm_probs"):
            t["out"] = torch.empty(b, V, dtype=torch.float32, device="cuda")
        else:
            t["out_ids"] = torch.empty(b, dtype=torch.int32, device="cuda")
        return t

    if name == "top_k_renorm_probs":
        kreg = lambda op, t: op(t["probs"], t["top_k"], t["out"])
        ref = lambda t: (_renorm(t["probs"], _top_k_mask(t["probs"], t["top_k"])),)
        check = lambda t: (t["out"],)
    elif name == "top_p_renorm_probs":
        kreg = lambda op, t: op(t["probs"], t["top_p"], t["out"])
        ref = lambda t: (_renorm(t["probs"], _top_p_mask(t["probs"], t["top_p"])),)
        check = lambda t: (t["out"],)
    elif name == "top_k_top_p_sampling_from_probs":
        kreg = lambda op, t: op(t["probs"], t["top_k"], t["top_p"], t["out_ids"], t["rng"])
        mask = lambda t: _top_k_top_p_mask(t["probs"], t["top_k"], t["top_p"])
        ref = lambda t: (_sample(t["probs"], mask(t)),)
        check = lambda t: (mask(t).gather(1, t["out_ids"].long()[:, None]).squeeze(1),)
    else:
        kreg = lambda op, t: op(t["probs"], t["min_p"], t["out_ids"], t["rng"])
        mask = lambda t: _min_p_mask(t["probs"], t["min_p"])
        ref = lambda t: (_sample(t["probs"], mask(t)),)
        check = lambda t: (mask(t).gather(1, t["out_ids"].long()[:, None]).squeeze(1),)

    renorm = name.endswith("renorm_probs")
    return dict(
        op=f"sampling.{name}",
        shape=f"B={b} V={V} f32",
        small=True,
        make=make,
        kreg=kreg,
        torch=ref,
        check=check,
        tol=TOL,
        # probs read (and out written for the renorm ops), the per-row parameter, ids, rng
        bytes=4 * b * V * (2 if renorm else 1) + 8 * b + (0 if renorm else 16),
    )


def cases():
    for b in BATCHES:
        for name in ("top_k_renorm_probs", "top_p_renorm_probs", "top_k_top_p_sampling_from_probs",
                     "min_p_sampling_from_probs"):
            yield _case(name, b)
