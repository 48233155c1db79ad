"""Self-test of tests/python/torch_samples.py: every op of the registry has samples, every
sample runs through the plain kreg Python API on the CPU, the samples are seeded, fresh,
small and not all zeros, and where a cheap torch formula exists the op's result on the
sample matches it. Run by hand:

    PYTHONPATH=build/python KREG_PLUGIN_DIR=build/plugins /usr/bin/python3 -m pytest -q \
        tests/python/test_torch_samples.py
"""

import math
import os
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable: no torch samples to test")

import kreg  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import torch_samples  # noqa: E402

ROOT = HERE.parents[1]
MANIFEST = os.environ.get("KREG_MANIFEST") or str(ROOT / "registry.yaml")
MAX_TENSOR_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def reg():
    return kreg.open(MANIFEST)


def _tensor_params(reg, op):
    return [p for p in reg.info(op)["params"] if p["kind"] == "Tensor"]


def _inputs(reg, op, sample):
    """(param, tensor) for the tensors the op reads (outputs may be uninitialized)."""
    params = _tensor_params(reg, op)
    assert len(params) == len(sample.args), f"{op} {sample.name}: {len(sample.args)} tensors"
    return [(p, t) for p, t in zip(params, sample.args) if t is not None and p["read"]]


def _run(reg, op, sample):
    reg.op(op)(*sample.args, **sample.kwargs)


def test_ops_are_the_registry_ops(reg):
    assert torch_samples.OPS == sorted(torch_samples.OPS)
    assert torch_samples.OPS == reg.list(), "an op of the registry has no samples (or a stale one)"


def test_unknown_op_and_dtype_are_refused():
    with pytest.raises(KeyError, match="no samples for op 'layernorm.nope'"):
        torch_samples.samples("layernorm.nope", "cpu")
    with pytest.raises(ValueError, match="dtype"):
        torch_samples.samples("layernorm.rmsnorm", "cpu", torch.int32)
    # An op that takes a resource needs the registry that will run it.
    with pytest.raises(ValueError, match=r"communication.all_reduce takes a communication.comm resource"):
        torch_samples.samples("communication.all_reduce", "cpu")


def test_resource_samples_carry_a_live_comm_and_torch_kwargs_its_id(reg):
    for op in [o for o in torch_samples.OPS if o.startswith("communication.")]:
        for s in torch_samples.samples(op, "cpu", reg=reg):
            comm = s.kwargs["comm"]
            assert isinstance(comm, kreg.Resource) and comm.valid and comm.type == "communication.comm"
            tk = torch_samples.torch_kwargs(s.kwargs)
            assert tk["comm"] == comm.id and type(tk["comm"]) is int
            assert {k: v for k, v in tk.items() if k != "comm"} == {k: v for k, v in s.kwargs.items() if k != "comm"}


@pytest.mark.parametrize("op", torch_samples.OPS)
def test_samples_are_well_formed(reg, op):
    first = torch_samples.samples(op, "cpu", reg=reg)
    again = torch_samples.samples(op, "cpu", reg=reg)
    assert 1 <= len(first) <= 3
    assert len({s.name for s in first}) == len(first), "sample names must be distinct"
    for s, t in zip(first, again):
        assert isinstance(s.kwargs, dict) and s.name
        for a, b in zip(s.args, t.args):
            if a is None:
                assert b is None
                continue
            assert a.is_contiguous(), f"{op} {s.name}"
            assert a.device.type == "cpu"
            assert a.numel() * a.element_size() <= MAX_TENSOR_BYTES, f"{op} {s.name}: {a.shape}"
            assert a.data_ptr() != b.data_ptr() or a.numel() == 0, "tensors must be fresh"
        for a, b in zip(s.keep, t.keep):
            assert torch.equal(a, b), f"{op} {s.name}: a kept pool is not seeded"
        for p, a in _inputs(reg, op, s):
            b = t.args[_tensor_params(reg, op).index(p)]
            if p["name"].endswith("_ptrs"):  # raw addresses of the kept pools: fresh each call
                assert a.ne(b).any() or a.eq(0).all()
                continue
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"{op} {s.name}: {p['name']} is not seeded"
            assert bool((a.view(torch.uint8) != 0).any()), f"{op} {s.name}: {p['name']} is all zeros"


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", torch_samples.OPS)
def test_samples_run_on_cpu(reg, op, dtype):
    for s in torch_samples.samples(op, "cpu", dtype, reg=reg):
        _run(reg, op, s)


def test_dtype_is_honoured(reg):
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        for s in torch_samples.samples("layernorm.rmsnorm", "cpu", dt):
            assert all(a.dtype == dt for a in s.args)
    assert torch_samples.samples("layernorm.rmsnorm", "cpu")[0].args[0].dtype == torch.float32
    # decode has no f32: it falls back to bf16.
    for s in torch_samples.samples("attention.decode", "cpu", torch.float32):
        assert s.args[0].dtype == torch.bfloat16
    # Fixed dtypes stay fixed.
    for s in torch_samples.samples("moe.topk_softmax", "cpu", torch.float16):
        assert s.args[2].dtype == torch.float32 and s.args[3].dtype == torch.int32


def test_some_samples_use_attributes_and_awkward_sizes(reg):
    with_kwargs = [op for op in torch_samples.OPS if any(s.kwargs for s in torch_samples.samples(op, "cpu", reg=reg))]
    assert len(with_kwargs) >= len(torch_samples.OPS) // 2, with_kwargs
    rows = [s.args[0].shape for s in torch_samples.samples("layernorm.rmsnorm", "cpu")]
    assert any(r[0] == 1 for r in rows) and any(r[1] % 8 for r in rows)


# ---- Results against independent torch formulas (fp32 on the CPU) ----


def _rms(s, w, eps):
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("op", ["layernorm.rmsnorm", "layernorm.gemma_rmsnorm"])
def test_rmsnorm_formula(reg, op):
    for s in torch_samples.samples(op, "cpu"):
        x, w, out = s.args
        eps = s.kwargs.get("eps", 1e-6)
        _run(reg, op, s)
        torch.testing.assert_close(out, _rms(x, (1 + w) if "gemma" in op else w, eps), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["layernorm.fused_add_rmsnorm", "layernorm.gemma_fused_add_rmsnorm"])
def test_fused_add_rmsnorm_formula(reg, op):
    for s in torch_samples.samples(op, "cpu"):
        x, residual, w = s.args
        total = x + residual
        eps = s.kwargs.get("eps", 1e-6)
        _run(reg, op, s)
        torch.testing.assert_close(residual, total)
        torch.testing.assert_close(x, _rms(total, (1 + w) if "gemma" in op else w, eps), atol=1e-5, rtol=1e-5)


ACTS = {
    "activation.silu_and_mul": torch.nn.functional.silu,
    "activation.gelu_and_mul": torch.nn.functional.gelu,
    "activation.gelu_tanh_and_mul": lambda a: 0.5 * a * (1 + torch.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
}


@pytest.mark.parametrize("op", sorted(ACTS))
def test_act_and_mul_formula(reg, op):
    for s in torch_samples.samples(op, "cpu"):
        x, out = s.args
        d = out.shape[1]
        _run(reg, op, s)
        torch.testing.assert_close(out, ACTS[op](x[:, :d]) * x[:, d:], atol=1e-5, rtol=1e-5)


def test_moe_sum_formula(reg):
    for s in torch_samples.samples("moe.sum", "cpu"):
        x, out = s.args
        _run(reg, "moe.sum", s)
        torch.testing.assert_close(out, x.sum(1) * s.kwargs.get("routed_scaling_factor", 1.0))


def test_concat_mla_k_formula(reg):
    for s in torch_samples.samples("attention.concat_mla_k", "cpu"):
        k_nope, k_rope, out = s.args
        _run(reg, "attention.concat_mla_k", s)
        assert torch.equal(out, torch.cat([k_nope, k_rope.expand(-1, k_nope.shape[1], -1)], -1))


def test_kvcache_store_formula(reg):
    for s in torch_samples.samples("kvcache.store", "cpu"):
        k, v, slots, k_cache, v_cache = s.args
        if k_cache.dtype != k.dtype:
            continue  # fp8
        want_k, want_v = k_cache.clone(), v_cache.clone()
        valid = slots >= 0
        want_k.flatten(0, 1)[slots[valid].long()] = k[valid]
        want_v.flatten(0, 1)[slots[valid].long()] = v[valid]
        _run(reg, "kvcache.store", s)
        assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


def test_kv_canary_verify_finds_exactly_the_planted_fault(reg):
    # The samples' records are built with torch_samples' own hash code: one violation each
    # means that code agrees with kreg's and that exactly one fault is planted.
    for s in torch_samples.samples("kv_canary.verify", "cpu"):
        violations, count = s.args[2], s.args[3]
        start = count.item()
        _run(reg, "kv_canary.verify", s)
        assert count.item() == start + 1, s.name
        assert start + 1 <= violations.shape[0]
        reasons = int(violations[start, 1])
        assert reasons == (8 if s.args[4] is not None else 1 | 4), s.name
        untouched = torch.ones(violations.shape[0], dtype=torch.bool)
        untouched[start] = False
        assert violations[untouched].eq(-1).all()


def test_kv_canary_stamp_matches_the_python_hash(reg):
    for s in torch_samples.samples("kv_canary.stamp", "cpu"):
        canary, plan, kv = s.args
        before = canary.clone()
        _run(reg, "kv_canary.stamp", s)
        chains = {}
        for slot, token, pos, prev in plan.tolist():
            prev_chain = chains.get(prev) if prev in chains else (
                torch_samples._SEED if prev < 0 else int(before[prev, 2]) & torch_samples._M64)
            chains[slot] = torch_samples._mix(prev_chain, token, pos)
            data = 0
            if kv is not None:
                data = torch_samples._data_hash(kv[slot].contiguous().view(torch.int64).flatten().tolist())
            want = [token, pos, torch_samples._s64(chains[slot]), torch_samples._s64(data)]
            assert canary[slot].tolist() == want, f"{s.name}: slot {slot}"


def test_lplb_solve_samples_converge(reg):
    for s in torch_samples.samples("lplb.solve", "cpu"):
        a, b, _, x, status = s.args
        _run(reg, "lplb.solve", s)
        assert status[0].item() == 1.0, f"{s.name}: status {status.tolist()}"
        torch.testing.assert_close(a.double() @ x.double(), b.double(), atol=1e-3, rtol=1e-3)
        assert bool((x >= 0).all())


def test_align_block_size_total(reg):
    for s in torch_samples.samples("moe.align_block_size", "cpu"):
        ids, _, _, total = s.args
        e, bs = s.kwargs["num_experts"], s.kwargs["block_size"]
        _run(reg, "moe.align_block_size", s)
        counts = torch.bincount(ids[ids >= 0].long(), minlength=e)
        assert total.item() == int(((counts + bs - 1) // bs * bs).sum())


def test_transfer_layers_copies_into_the_kept_pools(reg):
    s = torch_samples.samples("kvcache.transfer_layers", "cpu")[0]
    src, dst = s.keep
    src_idx, dst_idx = s.args[0], s.args[1]
    want = dst.clone()
    valid = (src_idx >= 0) & (dst_idx >= 0)
    want[:, dst_idx[valid]] = src[:, src_idx[valid]]
    _run(reg, "kvcache.transfer_layers", s)
    assert torch.equal(dst, want)


def test_decode_formula(reg):
    for s in torch_samples.samples("attention.decode", "cpu"):
        q, k_cache, v_cache, table, lens, out = s.args
        _run(reg, "attention.decode", s)
        b, hq, d = q.shape
        hk = k_cache.shape[2]
        for i in range(b):
            n = int(lens[i])
            if n == 0:
                assert out[i].eq(0).all()
                continue
            k = k_cache[table[i].long()].flatten(0, 1)[:n].float()  # [n, Hk, D]
            v = v_cache[table[i].long()].flatten(0, 1)[:n].float()
            kk = k.repeat_interleave(hq // hk, dim=1).transpose(0, 1)  # [Hq, n, D]
            vv = v.repeat_interleave(hq // hk, dim=1).transpose(0, 1)
            w = torch.softmax((q[i].float().unsqueeze(1) @ kk.transpose(1, 2)) * s.kwargs["scale"], -1)
            torch.testing.assert_close(out[i].float(), (w @ vv).squeeze(1), atol=2e-2, rtol=2e-2)


def test_rope_formula(reg):
    for s in torch_samples.samples("attention.rope", "cpu"):
        q, k, cache, pos = s.args
        neox = s.kwargs.get("is_neox", True)
        half = cache.shape[1] // 2
        cos, sin = cache[pos.long(), :half][:, None, :], cache[pos.long(), half:][:, None, :]

        def rotate(x):
            r = x[..., : 2 * half].clone()
            a, b = (r[..., :half], r[..., half:]) if neox else (r[..., 0::2], r[..., 1::2])
            a2, b2 = a * cos - b * sin, b * cos + a * sin
            r = torch.cat([a2, b2], -1) if neox else torch.stack([a2, b2], -1).flatten(-2)
            return torch.cat([r, x[..., 2 * half :]], -1)

        want_q, want_k = rotate(q), rotate(k)
        _run(reg, "attention.rope", s)
        torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k, want_k, atol=1e-5, rtol=1e-5)


# ---- communication on a world of one (torch_samples_communication.py) ----


def test_all_reduce_of_one_rank_leaves_x(reg):
    for s in torch_samples.samples("communication.all_reduce", "cpu", reg=reg):
        (x,) = s.args
        before = x.clone()
        _run(reg, "communication.all_reduce", s)
        assert torch.equal(x, before), s.name


@pytest.mark.parametrize("op", ["communication.all_gather", "communication.reduce_scatter"])
def test_gather_and_scatter_of_one_rank_copy_x(reg, op):
    for s in torch_samples.samples(op, "cpu", reg=reg):
        x, out = s.args
        out.fill_(float("nan"))
        _run(reg, op, s)
        assert torch.equal(out.flatten(), x.flatten()), s.name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_reduce_add_rmsnorm_of_one_rank_is_fused_add_rmsnorm(reg, dtype):
    for s in torch_samples.samples("communication.all_reduce_add_rmsnorm", "cpu", dtype, reg=reg):
        x, residual, w = s.args
        x2, residual2 = x.clone(), residual.clone()
        _run(reg, "communication.all_reduce_add_rmsnorm", s)
        reg.op("layernorm.fused_add_rmsnorm")(x2, residual2, w, eps=s.kwargs.get("eps", 1e-6))
        assert torch.equal(residual, residual2), s.name
        assert torch.equal(x, x2), s.name
