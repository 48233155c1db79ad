"""vs_torch.py cases for the attention group, in bf16 (the M-RoPE merge also in fp32, the
dtype of the frequency streams it merges), decode-sized (small: CUDA graphs) and large:

- concat_mla_k at DeepSeek-V3 dims (128 heads, 128 nope + 64 rope);
- mrope_interleave at Qwen3-VL dims (x[3, S, 64], mrope_section [24, 20, 20]);
- rope and fused_qk_norm_rope at Llama-3-8B / Qwen3-8B dims (Hq=32, Hk=8, D=128);
- decode (paged, GQA) at B=64, context 4096, Hq=32, Hk=8, D=128, page 16, against
  torch SDPA over the gathered pages (the gather is part of torch's time).

The torch side is the exact math docs/ops/attention.md defines: fp32 math, one rounding
at the store; in-place ops return new tensors here and are compared with kreg's mutated
ones.
"""

import torch
import torch.nn.functional as F

DTYPE = torch.bfloat16
ELEM = 2  # bytes per bf16
TOL = (2e-2, 2e-2)  # bf16: one rounding step either way
_GQA_SDPA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


def _randn(*shape, dtype=DTYPE):
    return torch.randn(*shape, device="cuda").to(dtype)


# ---- concat_mla_k ----


def _concat_case(t, h):
    def make():
        return {
            "k_nope": _randn(t, h, 128),
            "k_rope": _randn(t, 1, 64),
            "out": torch.empty(t, h, 192, dtype=DTYPE, device="cuda"),
        }

    return dict(
        op="attention.concat_mla_k",
        shape=f"T={t} H={h} 128+64 bf16 (DeepSeek-V3)",
        small=t <= 64,
        make=make,
        kreg=lambda op, d: op(d["k_nope"], d["k_rope"], d["out"]),
        torch=lambda d: (torch.cat([d["k_nope"], d["k_rope"].expand(-1, h, -1)], dim=-1),),
        check=lambda d: (d["out"],),
        tol=(0, 0),  # a copy: exact
        bytes=ELEM * (t * h * 128 + t * 64 + t * h * 192),
    )


# ---- mrope_interleave ----


def _mrope_reference(x, sections):
    out = x[0].clone()
    out[..., 1 : sections[1] * 3 : 3] = x[1, ..., 1 : sections[1] * 3 : 3]
    out[..., 2 : sections[2] * 3 : 3] = x[2, ..., 2 : sections[2] * 3 : 3]
    return out


def _mrope_case(s, dim, sections, dtype):
    elem = torch.tensor([], dtype=dtype).element_size()

    def make():
        return {"x": _randn(3, s, dim, dtype=dtype), "out": torch.empty(s, dim, dtype=dtype, device="cuda")}

    # Stream 0 is read whole; streams 1 and 2 only up to 3 * section (every 32-byte sector
    # there holds needed elements); out is written once.
    streams = dim + min(dim, 3 * sections[1]) + min(dim, 3 * sections[2])
    return dict(
        op="attention.mrope_interleave",
        shape=f"S={s} D={dim} sections={sections} {str(dtype).replace('torch.', '')} (Qwen3-VL)",
        small=s <= 64,
        make=make,
        kreg=lambda op, d: op(
            d["x"], d["out"], section_t=sections[0], section_h=sections[1], section_w=sections[2]
        ),
        torch=lambda d: (_mrope_reference(d["x"], sections),),
        check=lambda d: (d["out"],),
        tol=(0, 0),  # a selection: exact
        bytes=elem * s * (streams + dim),
    )


# ---- rope ----


def _rotate(xf, cos, sin, neox):
    """Rotates the leading 2 * cos.shape[-1] elements of fp32 xf[T, H, D]."""
    r = 2 * cos.shape[-1]
    rot = xf[..., :r]
    if neox:
        x1, x2 = rot[..., : r // 2], rot[..., r // 2 :]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    out = torch.cat([o1, o2], -1) if neox else torch.stack([o1, o2], -1).flatten(-2)
    return torch.cat([out, xf[..., r:]], -1)


def _rope_reference(q, k, cache, positions, neox):
    half = cache.shape[1] // 2
    rows = cache[positions]
    cos, sin = rows[:, :half], rows[:, half:]
    return (
        _rotate(q.float(), cos, sin, neox).to(q.dtype),
        _rotate(k.float(), cos, sin, neox).to(k.dtype),
    )


def _cos_sin_cache(max_pos, rotary_dim, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, device="cuda").float() / rotary_dim))
    freqs = torch.arange(max_pos, device="cuda").float()[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], -1).contiguous()


def _rope_case(t, hq, hk, dim, neox, max_pos):
    def make():
        return {
            "q": _randn(t, hq, dim),
            "k": _randn(t, hk, dim),
            "cache": _cos_sin_cache(max_pos, dim),
            # Prefill positions 0..T-1 (wrapped into the cache); decode: random.
            "positions": (torch.arange(t, device="cuda") % max_pos)
            if t > 64
            else torch.randint(0, max_pos, (t,), device="cuda"),
        }

    return dict(
        op="attention.rope",
        shape=f"T={t} Hq={hq} Hk={hk} D={dim} {'neox' if neox else 'gptj'} bf16 (Llama-3-8B)",
        small=t <= 64,
        make=make,
        kreg=lambda op, d: op(d["q"], d["k"], d["cache"], d["positions"], is_neox=neox),
        torch=lambda d: _rope_reference(d["q"], d["k"], d["cache"], d["positions"], neox),
        check=lambda d: (d["q"], d["k"]),  # rotated in place
        tol=TOL,
        # q and k read and written; one fp32 cache row and one int64 position per token.
        bytes=2 * ELEM * t * (hq + hk) * dim + t * (4 * dim + 8),
    )


# ---- fused_qk_norm_rope ----


def _fused_reference(qkv, q_weight, k_weight, positions, nq, nk, nv, hd, eps, base, neox):
    t = qkv.shape[0]
    x = qkv.float().view(t, nq + nk + nv, hd)

    def norm(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.float()

    # inv_freq = base^(-2i/hd) rounded to fp32; the angle is an fp32 product.
    inv_freq = (base ** (-2.0 * torch.arange(hd // 2, device=qkv.device, dtype=torch.float64) / hd)).float()
    angle = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    q = _rotate(norm(x[:, :nq], q_weight), cos, sin, neox)
    k = _rotate(norm(x[:, nq : nq + nk], k_weight), cos, sin, neox)
    return (torch.cat([q, k, x[:, nq + nk :]], 1).to(qkv.dtype).view(t, -1),)


def _fused_case(t, nq, nk, nv, hd, neox, base, model):
    eps = 1e-6

    def make():
        return {
            "qkv": _randn(t, (nq + nk + nv) * hd),
            "q_weight": (1.0 + 0.1 * torch.randn(hd, device="cuda")).to(DTYPE),
            "k_weight": (1.0 + 0.1 * torch.randn(hd, device="cuda")).to(DTYPE),
            "positions": torch.arange(t, device="cuda") if t > 64 else torch.randint(0, 8192, (t,), device="cuda"),
        }

    attrs = dict(num_heads_q=nq, num_heads_k=nk, num_heads_v=nv, head_dim=hd, eps=eps, base=base, is_neox=neox)
    return dict(
        op="attention.fused_qk_norm_rope",
        shape=f"T={t} heads={nq}/{nk}/{nv} hd={hd} {'neox' if neox else 'gptj'} bf16 ({model})",
        small=t <= 64,
        make=make,
        kreg=lambda op, d: op(d["qkv"], d["q_weight"], d["k_weight"], d["positions"], **attrs),
        torch=lambda d: _fused_reference(
            d["qkv"], d["q_weight"], d["k_weight"], d["positions"], nq, nk, nv, hd, eps, base, neox
        ),
        check=lambda d: (d["qkv"],),  # normalized and rotated in place
        tol=TOL,
        # q and k heads read and written (v untouched), two weights, int64 positions.
        bytes=2 * ELEM * t * (nq + nk) * hd + 2 * ELEM * hd + 8 * t,
    )


# ---- decode ----


def _decode_reference(q, k_cache, v_cache, block_table, seq_lens, scale, masked):
    b, hq, dim = q.shape
    page, hk = k_cache.shape[1], k_cache.shape[2]
    ctx = block_table.shape[1] * page
    pages = block_table.long()
    k = k_cache[pages].view(b, ctx, hk, dim).transpose(1, 2)  # [B, Hk, ctx, D]
    v = v_cache[pages].view(b, ctx, hk, dim).transpose(1, 2)
    if not _GQA_SDPA:
        k = k.repeat_interleave(hq // hk, dim=1)
        v = v.repeat_interleave(hq // hk, dim=1)
    mask = None
    if masked:
        mask = (torch.arange(ctx, device=q.device)[None, :] < seq_lens[:, None])[:, None, None, :]
    kwargs = {"enable_gqa": True} if _GQA_SDPA else {}
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, **kwargs)
    return (out.squeeze(2),)


def _decode_case(b, ctx, hq, hk, dim, page, ragged, model):
    max_pages = (ctx + page - 1) // page
    scale = dim**-0.5
    # Ragged: fixed lengths from ctx / 2 to ctx, most ending mid-page.
    lens = [ctx - (i * 7919) % (ctx // 2) if ragged else ctx for i in range(b)]

    def make():
        num_pages = b * max_pages
        return {
            "q": _randn(b, hq, dim),
            "k_cache": _randn(num_pages, page, hk, dim),
            "v_cache": _randn(num_pages, page, hk, dim),
            "block_table": torch.randperm(num_pages, device="cuda").view(b, max_pages).to(torch.int32),
            "seq_lens": torch.tensor(lens, device="cuda", dtype=torch.int32),
            "out": torch.empty(b, hq, dim, dtype=DTYPE, device="cuda"),
        }

    # Each K and V row of each sequence's context read once.
    kv_bytes = 2 * ELEM * sum(lens) * hk * dim
    return dict(
        op="attention.decode",
        shape=f"B={b} ctx={ctx}{' ragged' if ragged else ''} Hq={hq} Hk={hk} D={dim} page={page} bf16 ({model})",
        small=b * ctx <= 16384,  # graph replays: event pairs around a ~10 us call time the host
        make=make,
        kreg=lambda op, d: op(d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["seq_lens"], d["out"], scale=scale),
        torch=lambda d: _decode_reference(
            d["q"], d["k_cache"], d["v_cache"], d["block_table"], d["seq_lens"], scale, ragged
        ),
        check=lambda d: (d["out"],),
        tol=TOL,
        bytes=kv_bytes + 2 * ELEM * b * hq * dim + 4 * b * (max_pages + 1),
    )


def cases():
    for t in (16, 8192):
        yield _concat_case(t, 128)
    for s, dtype in ((16, torch.float32), (131072, torch.float32), (131072, DTYPE)):
        yield _mrope_case(s, 64, (24, 20, 20), dtype)
    for t in (16, 32768):
        yield _rope_case(t, 32, 8, 128, True, 32768)
    yield _rope_case(32768, 32, 8, 128, False, 32768)
    for t in (16, 32768):
        yield _fused_case(t, 32, 8, 8, 128, True, 1e6, "Qwen3-8B")
    yield _fused_case(32768, 32, 8, 8, 128, False, 1e4, "GPT-J pairing")
    yield _decode_case(1, 4096, 32, 8, 128, 16, False, "Llama-3-8B")
    yield _decode_case(16, 1024, 32, 8, 128, 16, True, "Llama-3-8B")
    yield _decode_case(64, 4096, 32, 8, 128, 16, False, "Llama-3-8B")
    yield _decode_case(32, 4096, 64, 8, 128, 16, True, "Llama-3-70B")
    # The rest of the range: long and short contexts, mid-size batches, SGLang's
    # token-granular cache (page 1), Gemma-2's 256-wide heads.
    yield _decode_case(1, 32768, 32, 8, 128, 16, False, "Llama-3-8B")
    yield _decode_case(8, 8192, 32, 8, 128, 16, True, "Llama-3-8B")
    yield _decode_case(64, 1024, 32, 8, 128, 16, False, "Llama-3-8B")
    yield _decode_case(32, 2048, 32, 8, 128, 1, True, "Llama-3-8B")
    yield _decode_case(16, 4096, 16, 8, 256, 16, True, "Gemma-2-9B")
