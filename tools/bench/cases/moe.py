"""vs_torch.py cases for the moe group: sum, topk_softmax, grouped_topk, route (every
method) and align_block_size, at decode sizes (T = 1 and 64: CUDA graphs) and large
(T = 32768; align_block_size also at its 4096-token target), with DeepSeek-V3 (E = 256,
8 groups, top-4 groups, top-8), Qwen3-MoE (E = 128, top-8), Mixtral (E = 8, top-2) and
Llama-4 (E = 128, top-1) routing shapes.

The torch side is the exact math the kreg ops define (docs/ops/moe.md). Expert ids are
compared exactly, so the inputs have no ties: every row of gating holds distinct
multiples of 1/32 (exact in bf16 and f32), and where the selection key is a sigmoid
(DeepSeekV3, grouped_topk, MiniMax2) torch evaluates it as 1 / (1 + exp(-x)) in fp32, the
same operations the kernel does, so both sides compare identical keys.
"""

import torch

SMALL_MAX_T = 64
WEIGHT_TOL = (1e-5, 1e-4)  # f32 weights from fp32 math
BF16_TOL = (2e-2, 2e-2)


# ---- inputs ----


def _distinct_logits(t, e, dtype):
    """Each row: a random permutation of (i - e/2) / 32, i < e: no ties, exact in bf16."""
    perm = torch.rand(t, e, device="cuda").argsort(dim=-1).float()
    return ((perm - e // 2) / 32.0).to(dtype)


def _bias(e):
    # Continuous values: a bias on a grid (the logits are multiples of 1/32) makes exact
    # ties in logits + bias, where torch.topk's order is unspecified.
    return (torch.rand(e, device="cuda") * 600.0 - 300.0) / 1024.0


def _outputs(t, k):
    return (
        torch.empty(t, k, dtype=torch.float32, device="cuda"),
        torch.empty(t, k, dtype=torch.int32, device="cuda"),
    )


def _sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def _pick(key, weight, k):
    ids = torch.topk(key, k, dim=-1, sorted=True).indices
    return weight.gather(-1, ids), ids


def _renorm(w):
    return w / w.sum(dim=-1, keepdim=True)


# ---- moe.sum ----


def _sum_case(t, k, h, model, scale=2.5):
    dtype = torch.bfloat16

    def make():
        return {
            "x": torch.randn(t, k, h, device="cuda").to(dtype),
            "out": torch.empty(t, h, dtype=dtype, device="cuda"),
        }

    return dict(
        op="moe.sum",
        shape=f"T={t} k={k} H={h} bf16 ({model})",
        small=t <= SMALL_MAX_T,
        make=make,
        kreg=lambda op, d: op(d["x"], d["out"], routed_scaling_factor=scale),
        torch=lambda d: ((d["x"].float().sum(dim=1) * scale).to(dtype),),
        check=lambda d: (d["out"],),
        tol=BF16_TOL,
        bytes=2 * (t * k * h + t * h),
    )


# ---- routing ----


def _topk_softmax_ref(d, k, renormalize, with_bias):
    logits = d["gating"].float()
    key = logits + d["bias"] if with_bias else logits
    w, ids = _pick(key, torch.softmax(logits, dim=-1), k)
    if renormalize:
        w = _renorm(w)
    return w, ids.to(torch.int32)


def _grouped_ref(d, k, n_group, topk_group, renormalize, scale):
    s = _sigmoid(d["gating"].float())
    b = s + d["bias"]
    t, e = b.shape
    groups = b.view(t, n_group, e // n_group)
    gscore = torch.topk(groups, min(2, e // n_group), dim=-1).values.sum(dim=-1)
    keep = torch.topk(gscore, topk_group, dim=-1, sorted=True).indices
    mask = torch.zeros(t, n_group, dtype=torch.bool, device=b.device).scatter_(1, keep, True)
    mask = mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
    w, ids = _pick(b.masked_fill(~mask, float("-inf")), s, k)
    if renormalize:
        w = _renorm(w)
    return w * scale, ids.to(torch.int32)


def _route_ref(d, method, k, n_group, topk_group, scale):
    logits = d["gating"].float()
    if method == "DeepSeekV3":
        return _grouped_ref(d, k, n_group, topk_group, True, scale)
    if method == "Default":
        w, ids = _pick(logits, torch.softmax(logits, dim=-1), k)
    elif method == "Renormalize":
        w, ids = _pick(logits, logits, k)
        w = torch.softmax(w, dim=-1)
    elif method in ("Llama4", "Sigmoid"):
        w, ids = _pick(logits, _sigmoid(logits), k)
    elif method == "RenormalizeNaive":
        w, ids = _pick(logits, torch.softmax(logits, dim=-1), k)
        w = _renorm(w)
    elif method == "TopK":
        w, ids = _pick(logits, logits, k)
    elif method == "SigmoidRenorm":
        w, ids = _pick(logits, _sigmoid(logits), k)
        w = _renorm(w)
    elif method == "MiniMax2":
        s = _sigmoid(logits)
        w, ids = _pick(s + d["bias"], s, k)
        w = _renorm(w)
    else:
        raise ValueError(method)
    return w * scale, ids.to(torch.int32)


def _routing_make(t, e, k, dtype):
    def make():
        w, ids = _outputs(t, k)
        return {"gating": _distinct_logits(t, e, dtype), "bias": _bias(e), "w": w, "ids": ids}

    return make


def _routing_bytes(t, e, k, dtype, with_bias):
    elem = 2 if dtype == torch.bfloat16 else 4
    return t * e * elem + t * k * 8 + (e * 4 if with_bias else 0)


def _dtype_name(dtype):
    return "bf16" if dtype == torch.bfloat16 else "f32"


def _topk_softmax_case(t, e, k, model, dtype, renormalize, with_bias):
    def kreg(op, d):
        op(d["gating"], d["bias"] if with_bias else None, d["w"], d["ids"], renormalize=renormalize)

    return dict(
        op="moe.topk_softmax",
        shape=f"T={t} E={e} k={k} {_dtype_name(dtype)} renorm={int(renormalize)}"
        f"{' bias' if with_bias else ''} ({model})",
        small=t <= SMALL_MAX_T,
        make=_routing_make(t, e, k, dtype),
        kreg=kreg,
        torch=lambda d: _topk_softmax_ref(d, k, renormalize, with_bias),
        check=lambda d: (d["w"], d["ids"]),
        tol=WEIGHT_TOL,
        bytes=_routing_bytes(t, e, k, dtype, with_bias),
    )


def _grouped_case(t, dtype, e=256, k=8, n_group=8, topk_group=4, scale=2.5):
    def kreg(op, d):
        op(d["gating"], d["bias"], d["w"], d["ids"], n_group=n_group, topk_group=topk_group,
           renormalize=True, routed_scaling_factor=scale)

    return dict(
        op="moe.grouped_topk",
        shape=f"T={t} E={e} k={k} groups={n_group}/{topk_group} {_dtype_name(dtype)} (DeepSeek-V3)",
        small=t <= SMALL_MAX_T,
        make=_routing_make(t, e, k, dtype),
        kreg=kreg,
        torch=lambda d: _grouped_ref(d, k, n_group, topk_group, True, scale),
        check=lambda d: (d["w"], d["ids"]),
        tol=WEIGHT_TOL,
        bytes=_routing_bytes(t, e, k, dtype, True),
    )


def _route_case(t, method, e, k, model, dtype, n_group=1, topk_group=1, scale=1.0):
    with_bias = method in ("DeepSeekV3", "MiniMax2")

    def kreg(op, d):
        op(d["gating"], d["bias"] if with_bias else None, d["w"], d["ids"], method=method,
           n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale)

    return dict(
        op="moe.route",
        shape=f"{method} T={t} E={e} k={k} {_dtype_name(dtype)} ({model})",
        small=t <= SMALL_MAX_T,
        make=_routing_make(t, e, k, dtype),
        kreg=kreg,
        torch=lambda d: _route_ref(d, method, k, n_group, topk_group, scale),
        check=lambda d: (d["w"], d["ids"]),
        tol=WEIGHT_TOL,
        bytes=_routing_bytes(t, e, k, dtype, with_bias),
    )


# ---- moe.align_block_size ----


def _align_ref(d, e, bs, p_len, b_len):
    flat = d["topk_ids"].flatten().long()
    n = flat.numel()
    counts = torch.bincount(flat, minlength=e)
    padded = (counts + bs - 1) // bs * bs
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)  # by expert, slots increasing within one
    experts = flat[order]
    first = torch.cumsum(counts, 0) - counts
    pos = starts[experts] + torch.arange(n, device=flat.device) - first[experts]
    sorted_ids = torch.full((p_len,), n, dtype=torch.int32, device=flat.device)
    sorted_ids[pos] = order.to(torch.int32)
    total = ends[-1]
    block_start = torch.arange(b_len, device=flat.device) * bs
    block_expert = torch.searchsorted(ends, block_start, right=True)
    expert_ids = torch.where(block_start < total, block_expert, -1).to(torch.int32)
    return sorted_ids, expert_ids, total.view(1).to(torch.int32)


def _align_case(t, k, e, bs, model):
    p_len = t * k + e * (bs - 1)
    b_len = (p_len + bs - 1) // bs

    def make():
        ids = torch.rand(t, e, device="cuda").argsort(dim=-1)[:, :k].to(torch.int32).contiguous()
        return {
            "topk_ids": ids,
            "sorted": torch.empty(p_len, dtype=torch.int32, device="cuda"),
            "experts": torch.empty(b_len, dtype=torch.int32, device="cuda"),
            "total": torch.empty(1, dtype=torch.int32, device="cuda"),
        }

    return dict(
        op="moe.align_block_size",
        shape=f"T={t} k={k} E={e} block={bs} ({model})",
        small=False,  # the torch reference copies to the host: not capturable in a graph
        make=make,
        kreg=lambda op, d: op(d["topk_ids"], d["sorted"], d["experts"], d["total"],
                              num_experts=e, block_size=bs),
        torch=lambda d: _align_ref(d, e, bs, p_len, b_len),
        check=lambda d: (d["sorted"], d["experts"], d["total"]),
        tol=(0, 0),
        bytes=4 * (t * k + p_len + b_len + 1),
    )


def cases():
    for t in (1, 64, 32768):
        yield _sum_case(t, 8, 4096, "k=8, H=4096")
    for t in (1, 64):
        yield _sum_case(t, 8, 7168, "DeepSeek-V3")
    for t in (1, 64, 32768):
        yield _topk_softmax_case(t, 256, 8, "E=256 top-8", torch.bfloat16, True, False)
        yield _topk_softmax_case(t, 128, 8, "Qwen3-MoE", torch.float32, True, False)
        yield _topk_softmax_case(t, 8, 2, "Mixtral", torch.bfloat16, True, False)
        yield _topk_softmax_case(t, 256, 8, "E=256 top-8", torch.float32, False, True)
        yield _grouped_case(t, torch.float32)
        yield _grouped_case(t, torch.bfloat16)
    for t in (64, 32768):
        for method in ("Default", "Renormalize", "RenormalizeNaive", "TopK", "SigmoidRenorm",
                       "MiniMax2", "Sigmoid"):
            yield _route_case(t, method, 256, 8, "E=256 top-8", torch.bfloat16)
        yield _route_case(t, "DeepSeekV3", 256, 8, "DeepSeek-V3", torch.float32, 8, 4, 2.5)
        yield _route_case(t, "Llama4", 128, 1, "Llama-4 Maverick", torch.bfloat16)
    for t in (64, 4096, 32768):
        yield _align_case(t, 8, 256, 64, "DeepSeek-V3")
    yield _align_case(4096, 8, 128, 128, "Qwen3-MoE")
