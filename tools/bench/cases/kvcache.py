"""kvcache cases for tools/bench/vs_torch.py (docs/ops/kvcache.md).

Baselines: index_copy_ / advanced-index assignment into the caches (in place, like kreg;
every call rewrites the same rows, so repeated calls are idempotent), and for the
transfers index_select into pinned host memory / non_blocking copies.

Slots are distinct and all valid in these cases (torch has no "-1 = skip"), so the
results are unambiguous. Inputs come from a seeded generator: make() is deterministic.
"""

import torch

FP8_MAX = 448.0


def _gen(seed=0):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _randn(shape, dtype, g):
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _slots(n, num_slots, g, dtype=torch.int64):
    # Distinct slots spread over the whole cache (paged allocators hand out scattered pages).
    return torch.randperm(num_slots, generator=g, device="cuda")[:n].to(dtype)


# ---- kvcache.store ----


def _store_case(T, Hk, D, page, dtype, cache_dtype, small, scale=1.0):
    num_slots = max(2 * T, 4096)
    P = (num_slots + page - 1) // page
    fp8 = cache_dtype == torch.float8_e4m3fn
    e = torch.tensor([], dtype=dtype).element_size()
    ce = 1 if fp8 else e
    k_scale, v_scale = (scale, 2 * scale) if fp8 else (1.0, 1.0)

    def make():
        g = _gen()
        return {
            "k": _randn((T, Hk, D), dtype, g),
            "v": _randn((T, Hk, D), dtype, g),
            "slot_mapping": _slots(T, P * page, g),
            "k_cache": torch.zeros((P, page, Hk, D), device="cuda", dtype=cache_dtype),
            "v_cache": torch.zeros((P, page, Hk, D), device="cuda", dtype=cache_dtype),
        }

    def quant(x, s):
        # The contract: x / scale in fp32, clamped to +-448, rounded to E4M3.
        return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)

    def ref(t):
        kc, vc = t["k_cache"], t["v_cache"]
        k, v = t["k"], t["v"]
        if fp8:
            k, v = quant(k, k_scale), quant(v, v_scale)
            kf, vf = kc.view(torch.uint8).flatten(0, 1), vc.view(torch.uint8).flatten(0, 1)
            kf.index_copy_(0, t["slot_mapping"], k.view(torch.uint8))
            vf.index_copy_(0, t["slot_mapping"], v.view(torch.uint8))
            return kc, vc
        kc.flatten(0, 1).index_copy_(0, t["slot_mapping"], k)
        vc.flatten(0, 1).index_copy_(0, t["slot_mapping"], v)
        return kc, vc

    name = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[dtype]
    cname = "fp8e4m3" if fp8 else name
    return dict(
        op="kvcache.store",
        shape=f"T={T} Hk={Hk} D={D} page={page} {name}->{cname}",
        small=small,
        make=make,
        kreg=lambda op, t: op(t["k"], t["v"], t["slot_mapping"], t["k_cache"], t["v_cache"],
                              k_scale=k_scale, v_scale=v_scale),
        torch=ref,
        check=lambda t: (t["k_cache"], t["v_cache"]),  # fp8 compares as values (tol below)
        # fp8: one E4M3 step is 12.5% relative; torch divides by a scalar as a multiply
        # by its reciprocal, which can land one step away from kreg's IEEE division.
        tol=(2e-3, 0.13) if fp8 else (0.0, 0.0),
        bytes=2 * T * Hk * D * (e + ce) + 8 * T,
    )


# ---- kvcache.set_mla_kv_buffer ----


def _mla_case(n, nope, rope, dtype, small):
    P = max(2 * n, 4096)
    e = torch.tensor([], dtype=dtype).element_size()

    def make():
        g = _gen(1)
        return {
            "kv_buffer": torch.zeros((P, nope + rope), device="cuda", dtype=dtype),
            "loc": _slots(n, P, g),
            "k_nope": _randn((n, nope), dtype, g),
            "k_rope": _randn((n, rope), dtype, g),
        }

    def ref(t):
        buf = t["kv_buffer"]
        buf[t["loc"]] = torch.cat([t["k_nope"], t["k_rope"]], dim=-1)
        return (buf,)

    return dict(
        op="kvcache.set_mla_kv_buffer",
        shape=f"n={n} nope={nope} rope={rope} bf16",
        small=small,
        make=make,
        kreg=lambda op, t: op(t["kv_buffer"], t["loc"], t["k_nope"], t["k_rope"]),
        torch=ref,
        check=lambda t: (t["kv_buffer"],),
        tol=(0.0, 0.0),
        bytes=2 * n * (nope + rope) * e + 8 * n,
    )


# ---- kvcache.transfer / kvcache.transfer_layers ----
#
# Device <-> pinned host. These cases cross the host link (link=...): vs_torch.py reports
# them as a percentage of a pinned memcpy in the same direction over link_bytes, the rows'
# payload (build/tests/bench/kreg-bench-transfer measures the same against
# cudaMemcpyAsync with random row order on both sides). The torch side: a gather on one
# side, a copy through the host (.cpu() / .to("cuda")), a scatter on the other.
# bytes: each row read once and written once (the copy convention), plus the indices.


def _names(dtype):
    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[dtype]


def _transfer_case(n, rows, row_elems, dtype, direction):
    """direction "d2h": device rows -> pinned host rows (offload); "h2d": back."""
    e = torch.tensor([], dtype=dtype).element_size()
    row_bytes = row_elems * e
    d2h = direction == "d2h"

    def make():
        g = _gen(2)
        dev = _randn((rows, row_elems), dtype, g)
        host = torch.empty((rows, row_elems), dtype=dtype, pin_memory=True)
        if d2h:
            host.zero_()
        else:
            host.copy_(dev.cpu())
            dev.zero_()
        src_idx, dst_idx = _slots(n, rows, g), _slots(n, rows, g)
        return {
            "src_idx": src_idx,
            "dst_idx": dst_idx,
            "src": dev if d2h else host,
            "dst": host if d2h else dev,
            # torch indexes host tensors with host indices.
            "src_idx_cpu": src_idx.cpu(),
            "dst_idx_cpu": dst_idx.cpu(),
        }

    def ref(t):
        dst = t["dst"]
        if d2h:
            dst[t["dst_idx_cpu"]] = t["src"][t["src_idx"]].cpu()
        else:
            dst[t["dst_idx"]] = t["src"][t["src_idx_cpu"]].to("cuda", non_blocking=True)
        return (dst,)

    arrow = "device->pinned" if d2h else "pinned->device"
    return dict(
        op="kvcache.transfer",
        shape=f"N={n} rows={rows} row={row_bytes}B {_names(dtype)} {arrow}",
        small=False,  # torch's side synchronizes the host: no CUDA graph
        make=make,
        kreg=lambda op, t: op(t["src_idx"], t["dst_idx"], t["src"], t["dst"]),
        torch=ref,
        check=lambda t: (t["dst"],),
        tol=(0.0, 0.0),
        bytes=2 * n * row_bytes + 16 * n,
        link=direction,
        link_bytes=n * row_bytes,
    )


def _transfer_layers_case(n, rows, layers, row_elems, dtype):
    """Offload N tokens of every layer: layer-first device pools -> pinned host pools."""
    e = torch.tensor([], dtype=dtype).element_size()
    row_bytes = row_elems * e

    def make():
        g = _gen(3)
        dev = _randn((layers, rows, row_elems), dtype, g)
        host = torch.zeros((layers, rows, row_elems), dtype=dtype, pin_memory=True)
        src_idx, dst_idx = _slots(n, rows, g), _slots(n, rows, g)
        return {
            "src_idx": src_idx,
            "dst_idx": dst_idx,
            # Addresses of each layer's pool (pinned host addresses are device-accessible).
            "src_ptrs": torch.tensor([dev[l].data_ptr() for l in range(layers)],
                                     dtype=torch.int64, device="cuda"),
            "dst_ptrs": torch.tensor([host[l].data_ptr() for l in range(layers)],
                                     dtype=torch.int64, device="cuda"),
            "src": dev,
            "dst": host,
            "dst_idx_cpu": dst_idx.cpu(),
        }

    def ref(t):
        dst = t["dst"]
        dst[:, t["dst_idx_cpu"]] = t["src"][:, t["src_idx"]].cpu()
        return (dst,)

    return dict(
        op="kvcache.transfer_layers",
        shape=f"L={layers} N={n} rows={rows} row={row_bytes}B {_names(dtype)} device->pinned",
        small=False,
        make=make,
        kreg=lambda op, t: op(t["src_idx"], t["dst_idx"], t["src_ptrs"], t["dst_ptrs"],
                              row_bytes=row_bytes, src_rows=rows, dst_rows=rows),
        torch=ref,
        check=lambda t: (t["dst"],),
        tol=(0.0, 0.0),
        bytes=2 * layers * n * row_bytes + 16 * n,
        link="d2h",
        link_bytes=layers * n * row_bytes,
    )


def cases():
    """Yields one dict per (op, shape)."""
    bf16 = torch.bfloat16
    # Llama-3-8B: 8 KV heads of 128; prefill-sized and decode-sized.
    yield _store_case(32768, 8, 128, 16, bf16, bf16, small=False)
    yield _store_case(32768, 8, 128, 16, bf16, torch.float8_e4m3fn, small=False, scale=0.05)
    yield _store_case(32768, 8, 128, 16, torch.float16, torch.float16, small=False)
    yield _store_case(64, 8, 128, 16, bf16, bf16, small=True)
    yield _store_case(16, 8, 128, 16, bf16, bf16, small=True)
    yield _store_case(16, 8, 128, 16, bf16, torch.float8_e4m3fn, small=True, scale=0.05)
    # DeepSeek-V3 MLA latent rows: kv_lora_rank 512 + rope 64.
    yield _mla_case(32768, 512, 64, bf16, small=False)
    yield _mla_case(64, 512, 64, bf16, small=True)
    yield _mla_case(16, 512, 64, bf16, small=True)
    # Transfers between the device and pinned host memory (issue 6): 4 KiB rows (a
    # Llama-3-8B token's K and V of one layer, bf16) and 256-byte rows, ~256 MB per call,
    # both directions; a decode-sized offload; all 32 layers of 2048 tokens in one launch.
    for d in ("d2h", "h2d"):
        yield _transfer_case(65536, 81920, 2048, bf16, d)
        yield _transfer_case(1 << 20, 1310720, 128, bf16, d)
    yield _transfer_case(64, 81920, 2048, bf16, "d2h")
    yield _transfer_layers_case(2048, 4096, 32, 2048, bf16)
