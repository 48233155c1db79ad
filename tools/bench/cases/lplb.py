"""PyTorch side-by-side cases for the lplb group (tools/bench/vs_torch.py).

lplb.solve has no torch equivalent (an interior-point LP solve in one thread block);
the lead times it with `build/tools/lplb_demo --device cuda` and `kreg bench`-style
CUDA-event timing in the demo. The cases here: build_lp (writing the LP), the
probabilities from an LP solution, and dispatch (inverse CDF per token slot).

Topology: DeepSeek-V3-like, 256 logical experts, 32 redundant replicas (288) on 8 GPUs,
at most 4 replicas per expert. Probabilities are multiples of 1/64 so that every partial
sum is exact in fp32 and torch's cumsum order cannot move a choice: dispatch ids compare
exactly.
"""

import torch

L, G, C, EXTRA = 256, 8, 4, 32


def _topology(gen):
    """log2phy [L, C] i32 (-1 padding), phy2gpu [R] i32, R = L + EXTRA."""
    per = [1] * L
    hot = torch.randperm(L, generator=gen)[:EXTRA].tolist()
    for e in hot:
        per[e] += 1
    R = sum(per)
    ids = torch.randperm(R, generator=gen).tolist()
    log2phy = torch.full((L, C), -1, dtype=torch.int32)
    nxt = 0
    for e in range(L):
        for c in range(per[e]):
            log2phy[e, c] = ids[nxt]
            nxt += 1
    phy2gpu = torch.randint(0, G, (R,), generator=gen, dtype=torch.int32)
    return log2phy, phy2gpu, R


def _zipf_counts(gen, tokens):
    ranks = torch.randperm(L, generator=gen).double() + 1.0
    w = 1.0 / ranks
    return torch.floor(w / w.sum() * tokens).to(torch.int32)


def _build_lp_torch(counts, log2phy, phy2gpu):
    Lx, Cx = log2phy.shape
    R = phy2gpu.shape[0]
    m, n = Lx + G, R + 1 + G
    dev = counts.device
    A = torch.zeros(m, n, dtype=torch.float32, device=dev)
    rows = torch.arange(Lx, device=dev).unsqueeze(1).expand(Lx, Cx)
    valid = log2phy >= 0
    A[rows[valid], log2phy[valid].long()] = 1.0
    A[Lx + phy2gpu.long(), torch.arange(R, device=dev)] = 1.0
    g = torch.arange(G, device=dev)
    A[Lx + g, R] = -1.0
    A[Lx + g, R + 1 + g] = 1.0
    b = torch.cat([counts.double().float(), torch.zeros(G, device=dev)])
    c = torch.zeros(n, device=dev)
    c[R] = 1.0
    return A, b, c


def _probs_torch(counts, log2phy, x, status):
    n_x = x.shape[0]
    valid = (log2phy >= 0) & (log2phy < n_x)
    xv = torch.where(valid, x[log2phy.clamp(0, n_x - 1).long()].clamp_min(0), torch.zeros((), device=x.device))
    s = xv.sum(-1, keepdim=True)
    nvalid = valid.sum(-1, keepdim=True).float()
    uniform = torch.where(valid, 1.0 / nvalid.clamp_min(1), torch.zeros((), device=x.device))
    use_x = (status[0] == 1.0) & (counts.unsqueeze(-1) > 0) & (s > 0)
    return torch.where(use_x, xv / torch.where(s > 0, s, torch.ones_like(s)), uniform)


def _dispatch_torch(topk_ids, probs, log2phy, u):
    p = torch.where(log2phy >= 0, probs.clamp_min(0), torch.zeros((), device=probs.device))
    total = p.sum(-1)
    cdf = p.cumsum(-1)
    e = topk_ids.long()
    target = u.clamp(0, 1) * total[e]
    hit = (target.unsqueeze(-1) < cdf[e]) & (p[e] > 0)
    first = hit.int().argmax(-1, keepdim=True)
    return log2phy[e].gather(-1, first).squeeze(-1)


def _dispatch_case(T, k, small):
    def make():
        gen = torch.Generator().manual_seed(1234 + T)
        log2phy, _, R = _topology(gen)
        weights = torch.randint(1, 17, (L, C), generator=gen).float()
        probs = torch.where(log2phy >= 0, weights / 64.0, torch.zeros(()))
        topk = torch.rand(T, L, generator=gen).argsort(-1)[:, :k].int()  # k distinct experts
        u = torch.rand(T, k, generator=gen)
        out = torch.full((T, k), -7, dtype=torch.int32)
        t = dict(topk_ids=topk, probs=probs, log2phy=log2phy, u=u, out=out)
        return {name: v.cuda() for name, v in t.items()}

    return dict(
        op="lplb.dispatch",
        shape=f"T={T} k={k} L={L} C={C} R={L + EXTRA}",
        small=small,
        make=make,
        kreg=lambda op, t: op(t["topk_ids"], t["probs"], t["log2phy"], t["u"], t["out"]),
        torch=lambda t: (_dispatch_torch(t["topk_ids"], t["probs"], t["log2phy"], t["u"]),),
        check=lambda t: (t["out"],),
        tol=(0, 0),
        bytes=3 * 4 * T * k + 2 * 4 * L * C,
    )


def cases():
    """Yields one dict per (op, shape)."""

    def make_lp():
        gen = torch.Generator().manual_seed(7)
        log2phy, phy2gpu, R = _topology(gen)
        counts = _zipf_counts(gen, 32768 * 8)
        m, n = L + G, R + 1 + G
        t = dict(counts=counts, log2phy=log2phy, phy2gpu=phy2gpu,
                 A=torch.full((m, n), float("nan")), b=torch.full((m,), float("nan")),
                 c=torch.full((n,), float("nan")))
        return {name: v.cuda() for name, v in t.items()}

    yield dict(
        op="lplb.build_lp",
        shape=f"L={L} R={L + EXTRA} G={G} (A 264x297 f32)",
        small=False,  # the torch reference is not capturable in a CUDA graph
        make=make_lp,
        kreg=lambda op, t: op(t["counts"], t["log2phy"], t["phy2gpu"], t["A"], t["b"], t["c"],
                              num_gpus=G),
        torch=lambda t: _build_lp_torch(t["counts"], t["log2phy"], t["phy2gpu"]),
        check=lambda t: (t["A"], t["b"], t["c"]),
        tol=(0, 0),
        bytes=4 * ((L + G) * (L + EXTRA + 1 + G) + (L + G) + (L + EXTRA + 1 + G))
        + 4 * (L + L * C + L + EXTRA),
    )

    def make_probs():
        gen = torch.Generator().manual_seed(11)
        log2phy, _, R = _topology(gen)
        counts = _zipf_counts(gen, 32768 * 8)
        x = torch.rand(R + 1 + G, generator=gen) * 100.0
        status = torch.tensor([1, 0, 0, 0, 12, 0, 0, L], dtype=torch.float32)
        t = dict(counts=counts, log2phy=log2phy, x=x, status=status,
                 out=torch.full((L, C), float("nan")))
        return {name: v.cuda() for name, v in t.items()}

    yield dict(
        op="lplb.replica_probabilities",
        shape=f"L={L} C={C} R={L + EXTRA}",
        small=True,
        make=make_probs,
        kreg=lambda op, t: op(t["counts"], t["log2phy"], t["x"], t["status"], t["out"]),
        torch=lambda t: (_probs_torch(t["counts"], t["log2phy"], t["x"], t["status"]),),
        check=lambda t: (t["out"],),
        tol=(1e-7, 1e-6),
        bytes=4 * (L + 2 * L * C + L * C + 8),
    )

    # Decode (a few tokens), and prefill (32768 tokens), DeepSeek-V3 top-8.
    yield _dispatch_case(16, 8, True)
    yield _dispatch_case(32768, 8, False)
