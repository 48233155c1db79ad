"""Small, valid, seeded random sample inputs for every op of the default registry.yaml.

Used by the torch integration tests (torch.library.opcheck, torch.compile) on the CPU and
on CUDA, so every sample satisfies both the CPU reference's contract and the CUDA
kernel's (docs/kernels.md, docs/ops/*.md): in-range indices (the CPU references refuse
what the CUDA kernels silently skip), distinct slots (duplicates land unspecified on
CUDA), head dims the CUDA kernels support, no ties in routing keys, at most one
kv_canary violation per call (CUDA appends violations in unspecified order).

    import torch_samples
    torch_samples.OPS                                # sorted op ids covered
    for s in torch_samples.samples("layernorm.rmsnorm", "cpu"):
        reg.op("layernorm.rmsnorm")(*s.args, **s.kwargs)

Ops that take a resource (Resource<communication.comm> comm) need the registry whose ops
will run them: samples(op, device, reg=reg) creates the resources there and passes them as
kreg.Resource attributes (kwargs["comm"]); kreg.torch's torch ops take the resource's id
instead: op(*s.args, **torch_samples.torch_kwargs(s.kwargs)). The resources live as long
as the Sample's kwargs.

Every call allocates fresh contiguous tensors (tests mutate them) from a CPU
torch.Generator seeded per op, so the values are the same on every device and run.
`dtype` is the shared floating dtype (None: float32 on the CPU, bfloat16 on CUDA); ops
with fixed dtypes ignore it, ops that lack float32 (attention.decode,
attention.fused_qk_norm_rope) use bfloat16 instead of it.

Tensors are at most a few KB, so torch.compile and opcheck stay fast.
"""

import zlib

import torch

__all__ = ["OPS", "Sample", "samples", "torch_kwargs"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class Sample:
    """One call of an op: `op(*args, **kwargs)`.

    args: the tensors in kreg signature order, output buffers included, None for an
    omitted optional tensor. kwargs: attributes. name: a short label. keep: tensors the
    call reads or writes through raw addresses (kvcache.transfer_layers' pointer
    tables); hold the Sample while the call runs, and read the results there.
    """

    __slots__ = ("args", "kwargs", "name", "keep")

    def __init__(self, args, kwargs, name, keep=()):
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.name = name
        self.keep = tuple(keep)

    def __repr__(self):
        return f"Sample({self.name!r})"


class _Maker:
    """Seeded random tensors: drawn on the CPU from one generator, then moved."""

    def __init__(self, op_id, device, reg=None):
        self.gen = torch.Generator()
        self.gen.manual_seed(zlib.crc32(op_id.encode()))
        self.device = device
        self.cuda = device.type == "cuda"
        self.op_id = op_id
        self.reg = reg

    def resource(self, type, **params):
        """A new resource of `type` on the registry the samples are for (samples(reg=))."""
        if self.reg is None:
            raise ValueError(
                f"torch_samples: {self.op_id} takes a {type} resource: pass the registry that "
                f"will run the samples (samples(op, device, reg=reg))"
            )
        return self.reg.create_resource(type, **params)

    def to(self, t):
        return t.to(self.device).contiguous()

    def randn(self, *shape, dtype=torch.float32, scale=1.0, offset=0.0):
        t = torch.randn(*shape, generator=self.gen, dtype=torch.float32) * scale + offset
        return self.to(t.to(dtype))

    def rand(self, *shape, scale=1.0):
        return self.to(torch.rand(*shape, generator=self.gen, dtype=torch.float32) * scale)

    def randint(self, low, high, *shape, dtype=torch.int64):
        return self.to(torch.randint(low, high, shape, generator=self.gen, dtype=torch.int64).to(dtype))

    def perm(self, n, dtype=torch.int64):
        """A random permutation of 0..n-1, on the CPU (for building tables)."""
        return torch.randperm(n, generator=self.gen).to(dtype)

    def slots(self, n, num, dtype=torch.int64, pad=0):
        """n distinct indices in [0, num), the last `pad` of them -1 (skipped)."""
        s = self.perm(num)[:n].clone()
        if pad:
            s[n - pad :] = -1
        return self.to(s.to(dtype))

    def tensor(self, values, dtype):
        return self.to(torch.tensor(values, dtype=dtype))

    def empty(self, *shape, dtype):
        return torch.empty(*shape, dtype=dtype, device=self.device)

    def pinned(self, t):
        """A page-locked host copy of t (CUDA samples that cross the host link)."""
        return t.cpu().contiguous().pin_memory()


def _can_pin(m):
    return m.cuda and torch.cuda.is_available()


def _fp8():
    return getattr(torch, "float8_e4m3fn", None)


# ---- layernorm ----


def _rmsnorm(m, dt, gemma):
    out = []
    for t, h, kw in ((3, 70, {}), (1, 256, {"eps": 1e-5})):
        w = m.randn(h, dtype=dt, scale=0.1, offset=0.0 if gemma else 1.0)
        out.append(Sample((m.randn(t, h, dtype=dt), w, m.empty(t, h, dtype=dt)), kw,
                          f"T={t} H={h} {_SHORT[dt]}"))
    return out


def _fused_add_rmsnorm(m, dt, gemma):
    out = []
    for t, h, kw in ((3, 70, {}), (1, 256, {"eps": 1e-5})):
        w = m.randn(h, dtype=dt, scale=0.1, offset=0.0 if gemma else 1.0)
        out.append(Sample((m.randn(t, h, dtype=dt), m.randn(t, h, dtype=dt), w), kw,
                          f"T={t} H={h} {_SHORT[dt]}"))
    return out


# ---- activation ----


def _act_and_mul(m, dt):
    return [
        Sample((m.randn(t, 2 * d, dtype=dt, scale=2.0), m.empty(t, d, dtype=dt)), {},
               f"T={t} D={d} {_SHORT[dt]}")
        for t, d in ((3, 37), (1, 128))
    ]


# ---- attention ----


def _concat_mla_k(m, dt):
    return [
        Sample((m.randn(t, h, 128, dtype=dt), m.randn(t, 1, 64, dtype=dt),
                m.empty(t, h, 192, dtype=dt)), {}, f"T={t} H={h} {_SHORT[dt]}")
        for t, h in ((2, 3), (1, 16))
    ]


def _mrope_interleave(m, dt):
    out = []
    # Default sections (24, 20, 20) exceed D / 3 at D = 38: the ranges clamp to D.
    for s, d, kw in ((5, 64, {}), (1, 38, {}), (3, 48, {"section_t": 8, "section_h": 4, "section_w": 4})):
        out.append(Sample((m.randn(3, s, d, dtype=dt), m.empty(s, d, dtype=dt)), kw,
                          f"S={s} D={d} {_SHORT[dt]}"))
    return out


def _cos_sin_cache(m, max_pos, rotary_dim, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.arange(max_pos).float()[:, None] * inv_freq[None, :]
    return m.to(torch.cat([freqs.cos(), freqs.sin()], -1))


def _rope(m, dt):
    out = []
    # (T, Hq, Hk, D, rotary_dim, positions dtype, is_neox); positions in [0, P): the CPU
    # reference refuses others, the CUDA kernel skips them.
    cases = ((3, 4, 2, 64, 64, torch.int64, True), (1, 2, 1, 40, 24, torch.int32, False))
    for t, hq, hk, d, r, pdt, neox in cases:
        p = 32
        args = (m.randn(t, hq, d, dtype=dt), m.randn(t, hk, d, dtype=dt), _cos_sin_cache(m, p, r),
                m.randint(0, p, t, dtype=pdt))
        kw = {} if neox else {"is_neox": False}
        out.append(Sample(args, kw, f"T={t} Hq={hq} Hk={hk} D={d} R={r} "
                          f"{'neox' if neox else 'gptj'} {_SHORT[dt]}"))
    return out


def _half_dtype(dt):
    return dt if dt in (torch.float16, torch.bfloat16) else torch.bfloat16


def _fused_qk_norm_rope(m, dt):
    dt = _half_dtype(dt)
    out = []
    # head_dim must be 64, 128 or 256 (both backends check it).
    cases = (
        (3, 4, 2, 2, 64, torch.int64, {}),
        (1, 2, 1, 1, 128, torch.int32, {"eps": 1e-5, "base": 1e6, "is_neox": False}),
        (2, 1, 1, 0, 256, torch.int64, {}),
    )
    for t, nq, nk, nv, hd, pdt, extra in cases:
        kw = dict(num_heads_q=nq, num_heads_k=nk, num_heads_v=nv, head_dim=hd, **extra)
        args = (m.randn(t, (nq + nk + nv) * hd, dtype=dt),
                m.randn(hd, dtype=dt, scale=0.1, offset=1.0),
                m.randn(hd, dtype=dt, scale=0.1, offset=1.0), m.randint(0, 8192, t, dtype=pdt))
        out.append(Sample(args, kw, f"T={t} heads={nq}/{nk}/{nv} hd={hd} {_SHORT[dt]}"))
    return out


def _decode(m, dt):
    dt = _half_dtype(dt)
    out = []
    # (B, Hq, Hk, D, page, pages per sequence M, seq_lens): lengths in [0, M * page]
    # (0 gives zeros), most ending mid-page; the block table a permutation of the N = B*M
    # pages (every id in [0, N)). D in {64, 128, 256}, Hq a multiple of Hk. The third has
    # M * page = 512 >= 2 * 256 tokens: the CUDA kernel splits the sequence and merges the
    # splits through its stream-ordered workspace (cudaMallocAsync); the others take one
    # split and no workspace.
    for b, hq, hk, d, page, mp, lens in ((3, 4, 2, 64, 16, 2, [29, 0, 32]), (1, 8, 1, 128, 8, 2, [13]),
                                         (1, 4, 1, 64, 32, 16, [300])):
        n = b * mp
        args = (m.randn(b, hq, d, dtype=dt), m.randn(n, page, hk, d, dtype=dt),
                m.randn(n, page, hk, d, dtype=dt), m.to(m.perm(n, torch.int32).view(b, mp)),
                m.tensor(lens, torch.int32), m.empty(b, hq, d, dtype=dt))
        out.append(Sample(args, {"scale": d**-0.5}, f"B={b} Hq={hq} Hk={hk} D={d} page={page} "
                          f"lens={lens} {_SHORT[dt]}"))
    return out


# ---- diffusion ----


def _residual_gate_add(m, dt):
    out = []
    for b, s, h, per_token in ((2, 3, 37, False), (1, 1, 64, True)):
        gate = m.randn(*((b, s, h) if per_token else (b, h)), dtype=dt)
        args = (m.randn(b, s, h, dtype=dt), m.randn(b, s, h, dtype=dt), gate,
                m.empty(b, s, h, dtype=dt))
        out.append(Sample(args, {}, f"B={b} S={s} H={h} gate {'[B,S,H]' if per_token else '[B,H]'} "
                          f"{_SHORT[dt]}"))
    return out


def _norm_scale_shift(m, dt):
    out = []
    # (B, S, H, per-token modulation, weight, bias, kwargs)
    for b, s, h, per_token, w, bias, kw in ((2, 3, 40, False, False, False, {}),
                                            (1, 2, 33, True, True, True, {"eps": 1e-5}),
                                            (1, 4, 16, False, True, False, {})):
        mod = (b, s, h) if per_token else (b, h)
        args = (m.randn(b, s, h, dtype=dt), m.randn(*mod, dtype=dt, scale=0.1),
                m.randn(*mod, dtype=dt, scale=0.1),
                m.randn(h, dtype=dt, scale=0.1, offset=1.0) if w else None,
                m.randn(h, dtype=dt, scale=0.1) if bias else None, m.empty(b, s, h, dtype=dt))
        out.append(Sample(args, kw, f"B={b} S={s} H={h} {'[B,S,H]' if per_token else '[B,H]'}"
                          f"{' weight' if w else ''}{' bias' if bias else ''} {_SHORT[dt]}"))
    return out


def _timestep_embedding(m, dt):
    out = []
    # downscale_freq_shift must differ from dim // 2.
    for n, dim, kw in ((3, 64, {"flip_sin_to_cos": True, "downscale_freq_shift": 0.0}),
                       (1, 33, {"scale": 2.0, "max_period": 5000})):
        args = (m.rand(n, scale=1000.0).to(dt), m.empty(n, dim, dtype=torch.float32))
        out.append(Sample(args, dict(dim=dim, **kw), f"N={n} dim={dim} t {_SHORT[dt]}"))
    return out


def _group_norm_silu(m, dt):
    out = []
    # x [N, C, *] (rank >= 2), num_groups divides C.
    for shape, g, kw in (((2, 8, 4, 4), 4, {}), ((1, 6, 5), 3, {"eps": 1e-6}), ((3, 4), 2, {})):
        c = shape[1]
        args = (m.randn(*shape, dtype=dt), m.randn(c, dtype=dt, scale=0.1, offset=1.0),
                m.randn(c, dtype=dt, scale=0.1), m.empty(*shape, dtype=dt))
        out.append(Sample(args, dict(num_groups=g, **kw),
                          f"{'x'.join(map(str, shape))} G={g} {_SHORT[dt]}"))
    return out


# ---- memory ----


def _copy_rows(m, dt):
    out = []
    # (src shape, dst shape, dtype, offset (dtype), count (dtype), offset_on_src); count may
    # exceed the rows available (both backends clamp).
    cases = (((10, 6), (4, 6), dt, 3, torch.int64, 4, torch.int32, True),
             ((3, 5), (8, 5), dt, 2, torch.int32, 5, torch.int64, False),
             ((4, 2, 3), (6, 2, 3), torch.uint8, 1, torch.int64, 3, torch.int64, True))
    for ss, ds, xdt, off, odt, cnt, cdt, on_src in cases:
        if xdt == torch.uint8:
            src, dst = m.randint(1, 255, *ss, dtype=xdt), m.randint(1, 255, *ds, dtype=xdt)
        else:
            src, dst = m.randn(*ss, dtype=xdt), m.randn(*ds, dtype=xdt)
        args = (src, dst, m.tensor([off], odt), m.tensor([cnt], cdt))
        name = {torch.uint8: "u8"}.get(xdt) or _SHORT[xdt]
        out.append(Sample(args, {"offset_on_src": on_src},
                          f"src {list(ss)} dst {list(ds)} offset {off} count {cnt} "
                          f"{'on src' if on_src else 'on dst'} {name}"))
    return out


# ---- kvcache ----


def _store(m, dt):
    out = []
    # Distinct slots in [0, P*S); -1 pads are skipped on both backends.
    for t, hk, d, page, pages, sdt, pad in ((4, 2, 16, 4, 3, torch.int64, 1), (1, 1, 7, 1, 5, torch.int32, 0)):
        args = (m.randn(t, hk, d, dtype=dt), m.randn(t, hk, d, dtype=dt),
                m.slots(t, pages * page, sdt, pad), m.randn(pages, page, hk, d, dtype=dt),
                m.randn(pages, page, hk, d, dtype=dt))
        out.append(Sample(args, {}, f"T={t} Hk={hk} D={d} page={page} {_SHORT[dt]}"))
    f8 = _fp8()
    if f8 is not None:
        t, hk, d, page, pages = 3, 2, 16, 4, 2
        args = (m.randn(t, hk, d, dtype=dt), m.randn(t, hk, d, dtype=dt),
                m.slots(t, pages * page), m.randn(pages, page, hk, d).to(f8),
                m.randn(pages, page, hk, d).to(f8))
        out.append(Sample(args, {"k_scale": 0.5, "v_scale": 2.0},
                          f"T={t} Hk={hk} D={d} page={page} {_SHORT[dt]}->fp8e4m3"))
    return out


def _set_mla_kv_buffer(m, dt):
    out = []
    for p, n, dn, dr, ldt, pad in ((8, 3, 32, 8, torch.int64, 0), (4, 2, 13, 3, torch.int32, 1)):
        args = (m.randn(p, dn + dr, dtype=dt), m.slots(n, p, ldt, pad), m.randn(n, dn, dtype=dt),
                m.randn(n, dr, dtype=dt))
        out.append(Sample(args, {}, f"P={p} N={n} {dn}+{dr} {_SHORT[dt]}"))
    return out


def _transfer(m, dt):
    # Rows of 3 x 8 elements: 48 bytes in bf16/f16, 96 in f32 (a positive multiple of 16
    # bytes). Indices live on the call's device; src/dst on it or, for CUDA, in pinned
    # host memory (pageable host memory is refused there).
    out = []
    kinds = [("dev", "dev"), ("dev", "dev")]
    if _can_pin(m):  # device -> device, an offload to pinned host memory, a load back
        kinds = [("dev", "dev"), ("dev", "pinned"), ("pinned", "dev")]
    for i, (sk, dk) in enumerate(kinds):
        n, sr, dr = (4, 6, 5) if i == 0 else (3, 4, 7)
        src, dst = m.randn(sr, 3, 8, dtype=dt), m.randn(dr, 3, 8, dtype=dt)
        src_idx, dst_idx = m.slots(n, sr), m.slots(n, dr, pad=1 if i == 0 else 0)
        if sk == "pinned":
            src = m.pinned(src)
        if dk == "pinned":
            dst = m.pinned(dst)
        where = "" if not m.cuda else f" {sk}->{dk}"
        out.append(Sample((src_idx, dst_idx, src, dst), {},
                          f"N={n} rows {sr}->{dr} row=3x8 {_SHORT[dt]}{where}"))
    return out


def _transfer_layers(m, dt):
    # The pointer tables hold raw addresses of per-layer pools (device memory or, on CUDA,
    # pinned host memory): Sample.keep holds the pools; the results are read there.
    out = []
    elems = 8 if dt == torch.float32 else 16  # 32-byte rows
    row_bytes = elems * torch.empty((), dtype=dt).element_size()
    layers = 2

    def table(ptrs):
        return m.tensor(ptrs, torch.int64)

    # 1: layer-first pools on both sides, packed rows.
    src = m.randn(layers, 6, elems, dtype=dt)
    dst = m.randn(layers, 5, elems, dtype=dt)
    args = (m.slots(3, 6), m.slots(3, 5, pad=1), table([src[l].data_ptr() for l in range(layers)]),
            table([dst[l].data_ptr() for l in range(layers)]))
    out.append(Sample(args, dict(row_bytes=row_bytes, src_rows=6, dst_rows=5),
                      f"L={layers} N=3 rows 6->5 row={row_bytes}B {_SHORT[dt]}", keep=(src, dst)))

    # 2: a page-first (token-major) source: row r of layer l at base + (r * L + l) * row_bytes;
    # a zero address leaves layer 2 out. On CUDA the destination pools are pinned host memory
    # when that is available (an offload).
    layers = 3
    src = m.randn(4, layers, elems, dtype=dt)
    dst = m.randn(layers, 4, elems, dtype=dt)
    if _can_pin(m):
        dst = m.pinned(dst)
    sp = [src.data_ptr() + l * row_bytes for l in range(layers)]
    dp = [dst[l].data_ptr() for l in range(layers)]
    sp[2] = 0
    args = (m.slots(2, 4), m.slots(2, 4), table(sp), table(dp))
    out.append(Sample(args, dict(row_bytes=row_bytes, src_rows=4, dst_rows=4,
                                 src_stride=layers * row_bytes),
                      f"L={layers} N=2 page-first src row={row_bytes}B {_SHORT[dt]}"
                      f"{' ->pinned' if _can_pin(m) else ''}", keep=(src, dst)))
    return out


# ---- kv_canary ----

_M64 = (1 << 64) - 1
_SEED = 0x4B5643414E415259
_GOLDEN = 0x9E3779B97F4A7C15


def _fmix(z):
    z &= _M64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix(prev, token, position):
    return _fmix(_fmix(prev ^ (token & _M64)) + (position & _M64) + _GOLDEN)


def _data_hash(words):
    """A row of int64 words (as Python ints) -> the uint64 data hash."""
    h = sum(_fmix((w & _M64) + (i + 1) * _GOLDEN) for i, w in enumerate(words)) & _M64
    return _fmix(h + 8 * len(words))


def _s64(u):
    return u - (1 << 64) if u >= 1 << 63 else u


def _stamp(m, dt):
    out = []
    s = 8
    # 1: a decode batch: three requests' next tokens, each chained to a slot not stamped in
    # this call (or -1, a first token); K/V rows of 2 x 4 elements (8 bytes a multiple).
    slots = m.perm(s).tolist()
    plan = [[slots[0], 101, 7, slots[5]], [slots[1], 202, 0, -1], [slots[2], 303, 12, slots[6]]]
    out.append(Sample((m.randint(0, 1 << 62, s, 4), m.tensor(plan, torch.int64),
                       m.randn(s, 2, 4, dtype=dt)), {}, f"S={s} decode batch of 3, kv {_SHORT[dt]}"))
    # 2: a prefill chunk (a run of consecutive rows of one request, in position order) and
    # one decode row of another request; records only.
    slots = m.perm(s).tolist()
    plan = [[slots[0], 11, 0, -1], [slots[1], 12, 1, slots[0]], [slots[2], 13, 2, slots[1]],
            [slots[3], 14, 3, slots[2]], [slots[4], 77, 5, slots[7]]]
    out.append(Sample((m.randint(0, 1 << 62, s, 4), m.tensor(plan, torch.int64), None), {},
                      f"S={s} prefill run of 4 + 1, no kv"))
    return out


def _verify(m, dt):
    # Consistent records for two requests, with exactly one planted fault per sample: the
    # CUDA kernel appends violations in an unspecified order, so one violation keeps the
    # outputs deterministic. count starts at 2 (it is cumulative): the violation lands at
    # index 2 of the 4-entry ring buffer, count becomes 3.
    out = []
    s, row_words = 10, 2
    for with_kv in (False, True):
        slots = m.perm(s).tolist()
        tokens = torch.randint(0, 128000, (7,), generator=m.gen).tolist()
        kv = torch.randint(-(1 << 62), 1 << 62, (s, row_words), generator=m.gen, dtype=torch.int64)
        canary = torch.randint(0, 1 << 62, (s, 4), generator=m.gen, dtype=torch.int64)
        plan = []
        for req, (first, length) in enumerate(((0, 4), (4, 3))):
            prev_slot, chain = -1, _SEED
            for p in range(length):
                slot, token = slots[first + p], tokens[first + p]
                chain = _mix(chain, token, p)
                data = _data_hash(kv[slot].tolist()) if with_kv else 0
                canary[slot] = torch.tensor([token, p, _s64(chain), _s64(data)], dtype=torch.int64)
                plan.append([slot, token, p, prev_slot])
                prev_slot = slot
        plan = torch.tensor(plan, dtype=torch.int64)
        if with_kv:
            kv[plan[5, 0], 1] ^= 1  # a flipped K/V bit: reason 8 on that slot only
        else:
            plan[2, 1] += 1  # a wrong expected token: reasons 1|4 on that row only
        args = (m.to(canary), m.to(plan), m.to(torch.full((4, 4), -1, dtype=torch.int64)),
                m.tensor([2], torch.int64), m.to(kv) if with_kv else None)
        out.append(Sample(args, {}, f"S={s} N=7 C=4 {'kv i64 x2' if with_kv else 'records only'}, 1 fault"))
    return out


# ---- moe ----


def _sum(m, dt):
    return [
        Sample((m.randn(t, k, h, dtype=dt), m.empty(t, h, dtype=dt)), kw, f"T={t} k={k} H={h} {_SHORT[dt]}")
        for t, k, h, kw in ((3, 4, 37, {}), (1, 8, 64, {"routed_scaling_factor": 2.5}))
    ]


def _distinct_logits(m, t, e, dt):
    """Each row: a permutation of (i - e/2) / 32: no ties, exact in every float dtype."""
    rows = torch.stack([torch.randperm(e, generator=m.gen) for _ in range(t)]).float()
    return m.to(((rows - e // 2) / 32.0).to(dt))


def _bias(m, e):
    # Continuous: a bias on the logits' 1/32 grid would make exact key ties.
    return m.to((torch.rand(e, generator=m.gen) * 600.0 - 300.0) / 1024.0)


def _routing_outputs(m, t, k):
    return m.empty(t, k, dtype=torch.float32), m.empty(t, k, dtype=torch.int32)


def _topk_softmax(m, dt):
    out = []
    for t, e, k, bias, kw in ((3, 16, 4, False, {"renormalize": True}),
                              (1, 7, 2, True, {"softcapping": 30.0}),
                              (5, 64, 8, False, {})):
        args = (_distinct_logits(m, t, e, dt), _bias(m, e) if bias else None, *_routing_outputs(m, t, k))
        out.append(Sample(args, kw, f"T={t} E={e} k={k}{' bias' if bias else ''} {_SHORT[dt]}"))
    return out


def _grouped_topk(m, dt):
    out = []
    # E % n_group == 0, 1 <= topk_group <= n_group, k <= topk_group * E / n_group.
    for t, e, k, ng, tg, extra in ((3, 32, 4, 4, 2, {}),
                                   (1, 16, 3, 8, 4, {"renormalize": False, "routed_scaling_factor": 2.5})):
        args = (_distinct_logits(m, t, e, dt), _bias(m, e), *_routing_outputs(m, t, k))
        out.append(Sample(args, dict(n_group=ng, topk_group=tg, **extra),
                          f"T={t} E={e} k={k} groups={ng}/{tg} {_SHORT[dt]}"))
    return out


def _route(m, dt):
    out = []
    # DeepSeekV3 (and MiniMax2) need the bias; Llama4 needs k == 1.
    for method, t, e, k, bias, extra in (
        ("Default", 3, 16, 4, False, {}),
        ("DeepSeekV3", 2, 32, 4, True, {"n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5}),
        ("Llama4", 2, 8, 1, False, {}),
    ):
        args = (_distinct_logits(m, t, e, dt), _bias(m, e) if bias else None, *_routing_outputs(m, t, k))
        kw = {} if method == "Default" else dict(method=method, **extra)
        out.append(Sample(args, kw, f"{method} T={t} E={e} k={k} {_SHORT[dt]}"))
    return out


def _align_block_size(m, dt):
    out = []
    # P >= T*K + E*(bs-1), B >= ceil(P / bs). Ids in [0, E); with ignore_invalid some -1
    # (the CUDA kernel skips invalid ids either way, the CPU reference only then). The
    # third has T*K = 5120 >= 9 * 512 slots: the CUDA path of three kernels with a
    # stream-ordered workspace (cudaMallocAsync); the others take the single-block kernel.
    for t, k, e, bs, invalid in ((3, 2, 8, 4, False), (5, 4, 16, 16, True), (640, 8, 32, 16, False)):
        ids = torch.rand(t, e, generator=m.gen).argsort(dim=-1)[:, :k].to(torch.int32).contiguous()
        if invalid:
            ids[1, 0] = -1
            ids[3, 2] = -1
        p = t * k + e * (bs - 1)
        b = (p + bs - 1) // bs
        args = (m.to(ids), m.empty(p, dtype=torch.int32), m.empty(b, dtype=torch.int32),
                m.empty(1, dtype=torch.int32))
        kw = dict(num_experts=e, block_size=bs)
        if invalid:
            kw["ignore_invalid"] = True
        out.append(Sample(args, kw, f"T={t} k={k} E={e} block={bs}{' invalid ids' if invalid else ''}"))
    return out


# ---- lplb ----


def _topology(m, num_experts, slots_per_expert, extra, num_gpus):
    """log2phy [L, C] i32 (-1 padding), phy2gpu [R] i32, R (CPU tensors)."""
    per = [1] * num_experts
    for e in torch.randperm(num_experts, generator=m.gen)[:extra].tolist():
        per[e] = min(slots_per_expert, per[e] + 1)
    r = sum(per)
    ids = torch.randperm(r, generator=m.gen).tolist()
    log2phy = torch.full((num_experts, slots_per_expert), -1, dtype=torch.int32)
    nxt = 0
    for e in range(num_experts):
        cols = torch.randperm(slots_per_expert, generator=m.gen)[: per[e]].tolist()  # padding anywhere
        for c in cols:
            log2phy[e, c] = ids[nxt]
            nxt += 1
    # Every GPU gets a replica, so that no GPU row of the LP is empty.
    phy2gpu = torch.cat([torch.arange(num_gpus), torch.randint(0, num_gpus, (r - num_gpus,), generator=m.gen)])
    phy2gpu = phy2gpu[torch.randperm(r, generator=m.gen)].to(torch.int32)
    return log2phy, phy2gpu, r


def _lp_of(counts, log2phy, phy2gpu, num_gpus):
    """build_lp's LP, written here in torch (f32 A, b, c on the CPU)."""
    L, C = log2phy.shape
    R = phy2gpu.shape[0]
    A = torch.zeros(L + num_gpus, R + 1 + num_gpus)
    for l in range(L):
        for c in range(C):
            if log2phy[l, c] >= 0:
                A[l, int(log2phy[l, c])] = 1.0
    for r in range(R):
        A[L + int(phy2gpu[r]), r] = 1.0
    for g in range(num_gpus):
        A[L + g, R] = -1.0
        A[L + g, R + 1 + g] = 1.0
    b = torch.cat([counts.float(), torch.zeros(num_gpus)])
    c = torch.zeros(R + 1 + num_gpus)
    c[R] = 1.0
    return A, b, c


def _build_lp(m, dt):
    out = []
    for L, C, extra, G, cdt in ((6, 3, 3, 3, torch.int32), (4, 2, 1, 2, torch.float32), (5, 2, 2, 2, torch.int64)):
        log2phy, phy2gpu, R = _topology(m, L, C, extra, G)
        counts = torch.randint(0, 200, (L,), generator=m.gen).to(cdt)
        M, N = L + G, R + 1 + G
        args = (m.to(counts), m.to(log2phy), m.to(phy2gpu), m.empty(M, N, dtype=torch.float32),
                m.empty(M, dtype=torch.float32), m.empty(N, dtype=torch.float32))
        kw = {} if G == 8 else {"num_gpus": G}
        name = {torch.int32: "i32", torch.int64: "i64", torch.float32: "f32"}[cdt]
        out.append(Sample(args, kw, f"L={L} C={C} R={R} G={G} counts {name}"))
    return out


def _dense_lp(m, rows, cols):
    """A dense LP with a known optimum (a KKT point: x* > 0 on a basis, s* > 0 elsewhere)."""
    A = (torch.rand(rows, cols, generator=m.gen, dtype=torch.float64) * 2 - 1).float().double()
    basis = torch.randperm(cols, generator=m.gen)
    x = torch.zeros(cols, dtype=torch.float64)
    s = torch.zeros(cols, dtype=torch.float64)
    x[basis[:rows]] = 0.5 + 1.5 * torch.rand(rows, generator=m.gen, dtype=torch.float64)
    s[basis[rows:]] = 0.5 + 1.5 * torch.rand(cols - rows, generator=m.gen, dtype=torch.float64)
    y = torch.rand(rows, generator=m.gen, dtype=torch.float64) * 2 - 1
    return A.float(), (A @ x).float(), (A.t() @ y + s).float()


def _solve(m, dt):
    out = []
    log2phy, phy2gpu, R = _topology(m, 6, 3, 3, 3)
    counts = torch.randint(1, 200, (6,), generator=m.gen)
    A, b, c = _lp_of(counts, log2phy, phy2gpu, 3)
    dense = _dense_lp(m, 3, 7)
    for (A, b, c), kw, name in (((A, b, c), {}, f"build_lp LP L=6 R={R} G=3"),
                                (dense, {"max_iter": 60, "tol": 1e-5}, "dense LP")):
        n = A.shape[1]
        args = (m.to(A), m.to(b), m.to(c), m.empty(n, dtype=torch.float32), m.empty(8, dtype=torch.float32))
        out.append(Sample(args, kw, f"{name} {A.shape[0]}x{n}"))
    return out


def _replica_probabilities(m, dt):
    out = []
    # x has N = R + 1 + G entries (solve's layout); ids in [0, N). status[0] == 1: use x
    # (converged); otherwise the uniform split.
    for L, C, extra, G, cdt, converged in ((6, 3, 3, 3, torch.int32, True), (4, 2, 2, 2, torch.int64, False)):
        log2phy, _, R = _topology(m, L, C, extra, G)
        counts = torch.randint(0, 200, (L,), generator=m.gen).to(cdt)
        counts[1] = 0  # uniform for this expert
        n = R + 1 + G
        x = torch.rand(n, generator=m.gen) * 100.0
        x[int(log2phy[0].max())] = 0.0  # one replica gets no tokens
        status = torch.tensor([1.0 if converged else 0.0, 1e-8, 1e-8, 1e-8, 7, 12.5, 0 if converged else 1, L])
        args = (m.to(counts), m.to(log2phy), m.to(x), m.to(status), m.empty(L, C, dtype=torch.float32))
        out.append(Sample(args, {}, f"L={L} C={C} R={R} {'converged' if converged else 'not converged'}"))
    return out


def _dispatch(m, dt):
    out = []
    # Probabilities are multiples of 1/64 (exact partial sums in fp32); ids in [0, L) or -1
    # (a masked slot: result -1); one expert with all-zero probabilities (uniform).
    for t, k, L, C, extra in ((3, 2, 6, 3, 3), (1, 4, 5, 2, 2)):
        log2phy, _, _ = _topology(m, L, C, extra, 2)
        weights = torch.randint(1, 17, (L, C), generator=m.gen).float()
        probs = torch.where(log2phy >= 0, weights / 64.0, torch.zeros(()))
        probs[L - 1] = 0.0
        ids = torch.stack([torch.randperm(L, generator=m.gen)[:k] for _ in range(t)]).to(torch.int32)
        if t == 1:
            ids[0, 1] = -1
        u = torch.rand(t, k, generator=m.gen)
        args = (m.to(ids), m.to(probs), m.to(log2phy), m.to(u), m.empty(t, k, dtype=torch.int32))
        out.append(Sample(args, {}, f"T={t} k={k} L={L} C={C}"))
    return out


_BUILDERS = {
    "activation.gelu_and_mul": _act_and_mul,
    "activation.gelu_tanh_and_mul": _act_and_mul,
    "activation.silu_and_mul": _act_and_mul,
    "attention.concat_mla_k": _concat_mla_k,
    "attention.decode": _decode,
    "attention.fused_qk_norm_rope": _fused_qk_norm_rope,
    "attention.mrope_interleave": _mrope_interleave,
    "attention.rope": _rope,
    "diffusion.group_norm_silu": _group_norm_silu,
    "diffusion.norm_scale_shift": _norm_scale_shift,
    "diffusion.residual_gate_add": _residual_gate_add,
    "diffusion.timestep_embedding": _timestep_embedding,
    "kv_canary.stamp": _stamp,
    "kv_canary.verify": _verify,
    "kvcache.set_mla_kv_buffer": _set_mla_kv_buffer,
    "kvcache.store": _store,
    "kvcache.transfer": _transfer,
    "kvcache.transfer_layers": _transfer_layers,
    "layernorm.fused_add_rmsnorm": lambda m, dt: _fused_add_rmsnorm(m, dt, False),
    "layernorm.gemma_fused_add_rmsnorm": lambda m, dt: _fused_add_rmsnorm(m, dt, True),
    "layernorm.gemma_rmsnorm": lambda m, dt: _rmsnorm(m, dt, True),
    "layernorm.rmsnorm": lambda m, dt: _rmsnorm(m, dt, False),
    "lplb.build_lp": _build_lp,
    "lplb.dispatch": _dispatch,
    "lplb.replica_probabilities": _replica_probabilities,
    "lplb.solve": _solve,
    "memory.copy_rows": _copy_rows,
    "moe.align_block_size": _align_block_size,
    "moe.grouped_topk": _grouped_topk,
    "moe.route": _route,
    "moe.sum": _sum,
    "moe.topk_softmax": _topk_softmax,
}



def _load_group_samples():
    """Merge torch_samples_<group>.py modules beside this file: each defines
    BUILDERS = {op_id: fn(maker, dtype) -> [Sample]} for one group (new groups add their
    samples there instead of editing this table)."""
    import importlib
    import pathlib

    here = pathlib.Path(__file__).resolve().parent
    for path in sorted(here.glob("torch_samples_*.py")):
        module = importlib.import_module(path.stem)
        for op_id, builder in module.BUILDERS.items():
            if op_id in _BUILDERS:
                raise RuntimeError(f"torch_samples: {path.name} defines samples for '{op_id}' twice")
            _BUILDERS[op_id] = builder


_load_group_samples()
OPS = sorted(_BUILDERS)


def torch_kwargs(kwargs):
    """A sample's kwargs for kreg.torch's torch ops: each kreg.Resource as its id."""
    import kreg

    return {k: (v.id if isinstance(v, kreg.Resource) else v) for k, v in kwargs.items()}


def samples(op_id, device, dtype=None, reg=None):
    """Fresh sample calls of op_id on device (str or torch.device); see the module doc.
    reg: the kreg.Registry that will run them (needed by ops that take resources)."""
    if op_id not in _BUILDERS:
        raise KeyError(f"torch_samples: no samples for op '{op_id}' (known: {', '.join(OPS)})")
    device = torch.device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _FLOATS:
        raise ValueError(f"torch_samples: dtype {dtype} is not one of float32, float16, bfloat16")
    return _BUILDERS[op_id](_Maker(op_id, device, reg), dtype)
