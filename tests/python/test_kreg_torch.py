"""Tests of kreg.torch (tools/python/kreg/torch.py and torch_ops.cpp), run by ctest as
`python.kreg_torch`: every op of registry.yaml as torch ops, on the CPU and (where a GPU
is) on CUDA, with the sample calls of torch_samples.py.

- eager: torch.ops.kreg_<group>.<op> writes what kreg.Op writes, bit for bit, and the
  functional form returns it without touching its inputs;
- torch >= 2.4: torch.library.opcheck of both forms, torch.compile(fullgraph=True) equal
  to eager with zero graph breaks, mode="reduce-overhead" (CUDA graphs) for every
  graph-safe op on CUDA, the MLP and decode chains compiled, a hot reload under a
  compiled function. Older torch (Debian 12's 1.13) skips these with its version.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python/test_kreg_torch.py
"""

import os
import pathlib
import shutil
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: kreg.torch is not tested")

import kreg  # noqa: E402

try:
    import kreg.torch as kt  # noqa: E402
except ImportError as e:
    pytest.skip(f"kreg.torch is not built: {e}", allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import torch_samples  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = os.environ.get("KREG_MANIFEST") or str(ROOT / "registry.yaml")
BUILD = pathlib.Path(os.environ.get("KREG_BUILD_DIR") or ROOT / "build")

HAVE_CUDA = torch.cuda.is_available()
MODERN = kt.TORCH_VERSION >= (2, 4)
needs_modern = pytest.mark.skipif(
    not MODERN,
    reason=f"torch {torch.__version__}: torch.compile of custom ops, register_fake and "
    f"torch.library.opcheck need torch >= 2.4",
)
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device (torch.cuda.is_available() is False)")
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=needs_cuda),
]


@pytest.fixture(scope="module")
def reg():
    r = kreg.open(MANIFEST)
    kt.register(r)
    return r


# ---- helpers: the two torch ops of a kreg op, and what a call writes ----


def mutating(op):
    p = kt.plan(op)
    return getattr(getattr(torch.ops, p["ns"]), p["name"]).default


def functional(op):
    p = kt.plan(op)
    if not p["functional_schema"]:
        return None
    return getattr(getattr(torch.ops, p["ns"]), p["functional_name"]).default


def tensor_params(reg, op):
    return [p for p in reg.info(op)["params"] if p["kind"] == "Tensor"]


def copy_of(a):
    if not isinstance(a, torch.Tensor):
        return a
    c = a.clone()
    if a.device.type == "cpu" and HAVE_CUDA and a.is_pinned():
        c = c.pin_memory()  # kvcache.transfer's host side must stay page-locked
    return c


def copies(args):
    return tuple(copy_of(a) for a in args)


def written(reg, op, args, sample):
    """The tensors a call wrote: its (a!) arguments, and what kvcache.transfer_layers
    writes through the raw addresses it is given (Sample.keep). A CUDA kernel may write
    pinned host memory (kvcache.transfer's offloads) asynchronously on its stream, and the
    host reads such a tensor without any stream ordering: wait for the device first."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    out = [a for p, a in zip(tensor_params(reg, op), args) if p["written"]]
    return out + [k for k in sample.keep if isinstance(k, torch.Tensor)]


def functional_inputs(reg, op, args):
    """The functional form's tensor arguments: the sample's without the write-only ones."""
    by_name = {p["name"]: a for p, a in zip(tensor_params(reg, op), args)}
    return tuple(by_name[n] for n in kt.plan(op)["inputs"] if n in by_name)


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{what}: result {i}"
        if g.dtype.is_floating_point:
            # The same kernel on the same inputs: bit-exact, NaN where the other has NaN.
            assert torch.equal(torch.nan_to_num(g.float().cpu()), torch.nan_to_num(w.float().cpu())), f"{what}: result {i}"
        else:
            assert torch.equal(g.cpu(), w.cpu()), f"{what}: result {i}"


def cases(device):
    for op in torch_samples.OPS:
        yield pytest.param(op, device, id=f"{op}-{device}")


ALL = [c for d in ("cpu", "cuda") for c in cases(d)]


def skip_unless_device(device):
    if device == "cuda" and not HAVE_CUDA:
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")


# ---- registration ----


def test_every_op_is_registered_with_kregs_schema(reg):
    assert set(reg.list()) <= set(kt.registered())
    assert set(torch_samples.OPS) == set(reg.list())
    for op in reg.list():
        p = kt.plan(op)
        schema = mutating(op)._schema
        params = reg.info(op)["params"]
        assert [a.name for a in schema.arguments] == [q["name"] for q in params], op
        for a, q in zip(schema.arguments, params):
            is_write = a.alias_info is not None and a.alias_info.is_write
            assert is_write == bool(q.get("written", False)), f"{op}: {a.name}"
            if q["kind"] != "Tensor":
                # A resource is its registry id (kreg.Resource.id): a plain int.
                want = {"int": "int", "float": "float", "bool": "bool", "str": "string", "Resource": "int"}[q["kind"]]
                assert a.type.kind().lower().startswith(want), f"{op}: {a.name}"
                assert (a.default_value is not None) == (not q["required"]), f"{op}: {a.name}"
        f = functional(op)
        if f is None:
            assert p["reason"], op
        else:
            assert all(a.alias_info is None for a in f._schema.arguments), op
            assert len(f._schema.returns) == len(p["results"]) >= 1, op


def test_ops_namespace_and_missing_functional_form(reg):
    assert kt.ops.layernorm.rmsnorm is functional("layernorm.rmsnorm")
    assert "rmsnorm" in dir(kt.ops.layernorm)
    with pytest.raises(AttributeError, match="no functional form: dimension K of the output"):
        kt.ops.moe.topk_softmax
    with pytest.raises(AttributeError, match="no registered op 'layernorm.nope'"):
        kt.ops.layernorm.nope
    with pytest.raises(AttributeError, match="no registered group"):
        kt.ops.nope
    with pytest.raises(LookupError):
        kt.plan("layernorm.nope")


def test_register_is_idempotent_and_namespaces_have_one_owner(reg):
    assert kt.register(reg) == []
    with pytest.raises(RuntimeError, match=r"torch.ops.kreg_\w+ is already backed by"):
        kt.register(kreg.open(MANIFEST))
    with pytest.raises(TypeError):
        kt.register("registry.yaml")


# ---- eager ----


@pytest.mark.parametrize("op,device", ALL)
def test_eager_matches_kreg(reg, op, device):
    skip_unless_device(device)
    handle = reg.op(op)
    fop = functional(op)
    for s in torch_samples.samples(op, device, reg=reg):
        tkw = torch_samples.torch_kwargs(s.kwargs)  # resources by id
        a, b = copies(s.args), copies(s.args)
        s_b = torch_samples.Sample(b, s.kwargs, s.name, s.keep)
        mutating(op)(*a, **tkw)
        want = [w.clone() for w in written(reg, op, a, s)]
        # The same call through kreg.Op (transfer_layers writes to s.keep: run it again).
        handle(*b, **s.kwargs)
        assert_same(written(reg, op, b, s_b), want, f"{op} [{s.name}] torch op vs kreg.Op")
        if fop is None:
            continue
        inputs = functional_inputs(reg, op, copies(s.args))
        before = [copy_of(t) for t in inputs if isinstance(t, torch.Tensor)]
        got = fop(*inputs, **tkw)
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        assert_same(got, want[: len(got)], f"{op} [{s.name}] functional")
        after = [t for t in inputs if isinstance(t, torch.Tensor)]
        assert_same(after, before, f"{op} [{s.name}] functional form changed its inputs")


def test_errors_are_torch_style_with_kregs_message(reg):
    x, w, out = torch.randn(3, 70), torch.randn(71), torch.empty(3, 70)
    with pytest.raises(ValueError, match=r"layernorm\.rmsnorm.*'weight'.*\[71\].*H = 70"):
        torch.ops.kreg_layernorm.rmsnorm(x, w, out)
    with pytest.raises(ValueError, match=r"layernorm\.rmsnorm"):
        torch.ops.kreg_layernorm.rmsnorm(x.double(), w.double()[:70], out.double())
    with pytest.raises(ValueError, match=r"must be a multiple of 2 \(\[T,2\*D\]\)"):
        kt.ops.activation.silu_and_mul(torch.randn(3, 7))
    with pytest.raises(RuntimeError):  # schema mismatch: torch's own argument error
        torch.ops.kreg_layernorm.rmsnorm(x, w)
    w70 = torch.randn(70)
    with pytest.raises(ValueError, match=r"layernorm\.rmsnorm.*'x'.*contiguous"):
        torch.ops.kreg_layernorm.rmsnorm(torch.randn(70, 3).t(), w70, out)
    with pytest.raises(ValueError, match=r"'x' must have 2 dimensions, got 1"):
        kt.ops.layernorm.rmsnorm(torch.randn(70), w70)
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"attribute 'eps' must be a finite float"):
            torch.ops.kreg_layernorm.rmsnorm(x, w70, out, eps=bad)
    logits, ids = torch.randn(2, 8), torch.empty(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"attribute 'method' contains a NUL character"):
        torch.ops.kreg_moe.route(logits, None, torch.empty(2, 2), ids, method="Def\0ault")
    # An int past int64 never reaches kreg: torch's argument parser refuses it.
    ids = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises((RuntimeError, TypeError, OverflowError)):
        torch.ops.kreg_moe.align_block_size(ids, torch.empty(8, dtype=torch.int32),
                                            torch.empty(2, dtype=torch.int32),
                                            torch.empty(1, dtype=torch.int32),
                                            num_experts=2**70, block_size=4)
    # An expanded view has no memory behind its huge extent: an error, never an allocation.
    with pytest.raises((ValueError, RuntimeError)):
        kt.ops.activation.silu_and_mul(torch.zeros(1, 2).expand(2**62, 2))


@needs_cuda
def test_runs_on_torchs_current_stream(reg):
    # On a side stream, x is written after a long sleep; a kernel on any other stream would
    # read it before that and normalise zeros.
    src = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    x = torch.zeros_like(src)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        x.copy_(src)
        out = kt.ops.layernorm.rmsnorm(x, w)
    side.synchronize()
    want = torch.empty_like(src)
    reg.op("layernorm.rmsnorm")(src, w, want)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@needs_cuda
def test_pdl_chains_equal_plain_launches(reg, fresh_dynamo):
    # kreg.set_pdl(True): every CUDA call asks for programmatic dependent launch; a chain in
    # which each kernel reads the one before's output (eager, through kreg.Op, and
    # compiled under CUDA graphs) gives bit for bit what it gives without.
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(4096, 4096, device="cuda", generator=g).bfloat16()
    res = torch.randn(4096, 4096, device="cuda", generator=g).bfloat16()
    w = torch.randn(4096, device="cuda", generator=g).bfloat16()

    def chain(x, res):
        a = kt.ops.layernorm.rmsnorm(x, w)
        b = kt.ops.activation.silu_and_mul(a)
        c, r = kt.ops.layernorm.fused_add_rmsnorm(torch.cat([b, b], dim=1), res, w)
        return c, r

    def kreg_chain(x):
        a, c = torch.empty_like(x), torch.empty(x.shape[0], x.shape[1] // 2, dtype=x.dtype, device="cuda")
        reg.op("layernorm.rmsnorm")(x, w, a)
        reg.op("activation.silu_and_mul")(a, c)
        return c

    try:
        kreg.set_pdl(False)
        want, want_k = chain(x, res), kreg_chain(x)
        compiled = torch.compile(chain, fullgraph=True, mode="reduce-overhead")
        kreg.set_pdl(True)
        assert kreg.pdl()
        for _ in range(3):
            got, got_k = chain(x, res), kreg_chain(x)
            assert_same(list(got), list(want), "torch ops with PDL")
            assert_same([got_k], [want_k], "kreg.Op with PDL")
        for _ in range(3):
            got = [t.clone() for t in compiled(x, res)]
        torch.cuda.synchronize()
        assert_same(got, list(want), "compiled, CUDA graphs, PDL")
    finally:
        kreg.set_pdl(False)


@needs_cuda
def test_workspace_comes_from_torchs_caching_allocator(reg):
    # moe.align_block_size takes scratch memory when T*k spans 9 or more chunks of 512.
    tokens, k, experts, block = 2048, 8, 64, 16
    ids = torch.randint(0, experts, (tokens, k), dtype=torch.int32, device="cuda")
    padded = tokens * k + experts * (block - 1)
    blocks = (padded + block - 1) // block
    outs = lambda: (torch.empty(padded, dtype=torch.int32, device="cuda"),  # noqa: E731
                    torch.empty(blocks, dtype=torch.int32, device="cuda"),
                    torch.empty(1, dtype=torch.int32, device="cuda"))
    a, b = outs(), outs()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.ops.kreg_moe.align_block_size(ids, *a, num_experts=experts, block_size=block)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] > before
    reg.op("moe.align_block_size")(ids, *b, num_experts=experts, block_size=block)
    torch.cuda.synchronize()
    assert_same(list(a), list(b), "align_block_size with torch's workspace")


# ---- torch.library.opcheck, torch.compile ----


@pytest.fixture
def fresh_dynamo():
    if not MODERN:
        yield
        return
    torch._dynamo.reset()  # every test compiles afresh (no cache limit shared across ops)
    yield
    torch._dynamo.reset()


def backend(device):
    # Inductor on CUDA; on the CPU aot_eager (the same tracing, functionalization and
    # partitioning, without compiling C++ for every copy of a mutated input).
    return "inductor" if device == "cuda" else "aot_eager"


@needs_modern
@pytest.mark.parametrize("op,device", ALL)
def test_opcheck(reg, op, device):
    skip_unless_device(device)
    s = torch_samples.samples(op, device, reg=reg)[0]
    kw = torch_samples.torch_kwargs(s.kwargs)
    utils = opcheck_utils(s.args)
    torch.library.opcheck(mutating(op), copies(s.args), kw, test_utils=utils)
    fop = functional(op)
    if fop is not None:
        torch.library.opcheck(fop, functional_inputs(reg, op, copies(s.args)), kw, test_utils=utils)
    if "test_schema" not in utils:
        check_declared_mutations(mutating(op), copies(s.args), kw)


def opcheck_utils(args):
    """opcheck's checks for these arguments. torch's schema check compares tensors before
    and after the call with arithmetic that float8 lacks ("mul_cuda" not implemented for
    'Float8_e4m3fn', torch 2.11), so where a float8 tensor is involved it is replaced by
    check_declared_mutations, which compares bytes."""
    utils = ["test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"]
    f8 = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}
    if any(isinstance(a, torch.Tensor) and a.dtype in f8 for a in args):
        utils.remove("test_schema")
    return utils


def check_declared_mutations(op, args, kw):
    """What opcheck's test_schema checks of mutation: every tensor the schema does not mark
    written (a!) has the same bytes after the call."""
    before = [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    op(*args, **kw)
    schema = op._schema.arguments
    for i, (a, b) in enumerate(zip(args, before)):
        if b is None:
            continue
        info = schema[i].alias_info
        if info is not None and info.is_write:
            continue
        same = torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        assert same, f"{op}: argument {schema[i].name} is not declared written but changed"


@needs_modern
@pytest.mark.parametrize("op,device", ALL)
def test_compile_fullgraph(reg, op, device, fresh_dynamo):
    skip_unless_device(device)
    s = torch_samples.samples(op, device, reg=reg)[0]
    # A resource is an int in the graph (its id), as any other int attribute.
    mop, fop, kw = mutating(op), functional(op), torch_samples.torch_kwargs(s.kwargs)

    def call(*args):
        mop(*args, **kw)

    a, b = copies(s.args), copies(s.args)
    call(*a)
    want = [w.clone() for w in written(reg, op, a, s)]
    explained = torch._dynamo.explain(call)(*copies(s.args))
    assert explained.graph_break_count == 0, f"{op}: {explained.break_reasons}"
    torch.compile(call, fullgraph=True, backend=backend(device))(*b)
    assert_same(written(reg, op, b, torch_samples.Sample(b, kw, s.name, s.keep)), want, f"{op} compiled (in place)")
    if fop is None:
        return

    def fcall(*inputs):
        r = fop(*inputs, **kw)
        return tuple(r) if isinstance(r, (tuple, list)) else (r,)

    inputs = functional_inputs(reg, op, copies(s.args))
    explained = torch._dynamo.explain(fcall)(*inputs)
    assert explained.graph_break_count == 0, f"{op}: {explained.break_reasons}"
    got = torch.compile(fcall, fullgraph=True, backend=backend(device))(*inputs)
    assert_same(list(got), want[: len(got)], f"{op} compiled (functional)")


def graph_safe(reg, op):
    # Every device implementation (cuda, jit, nccl), as kreg.torch tags them.
    return all(i["graph_safe"] for i in reg.info(op)["implementations"] if i["backend"] != "cpu")


CUDA_CASES = list(cases("cuda"))


@needs_modern
@needs_cuda
@pytest.mark.parametrize("op,device", CUDA_CASES)
def test_reduce_overhead_cuda_graphs(reg, op, device, fresh_dynamo):
    if not graph_safe(reg, op):
        pytest.skip(f"{op}: a device implementation is not graph-safe (cudagraph_unsafe)")
    s = torch_samples.samples(op, device, reg=reg)[0]
    if any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in s.args):
        pytest.skip(f"{op} [{s.name}]: host tensors; CUDA graphs take device tensors only")
    mop, fop, kw = mutating(op), functional(op), torch_samples.torch_kwargs(s.kwargs)
    params = tensor_params(reg, op)
    a = copies(s.args)
    mop(*a, **kw)
    want = [w.clone() for w in written(reg, op, a, s)]
    if fop is not None:
        inputs = functional_inputs(reg, op, copies(s.args))

        def step(*xs):
            r = fop(*xs, **kw)
            return tuple(t.clone() for t in (r if isinstance(r, (tuple, list)) else (r,)))
    else:
        # No functional form: the function allocates the outputs itself, so that no input
        # is mutated (cudagraph trees skip graphs that mutate their inputs).
        # Both sides start from zeroed outputs: what the op leaves unwritten by contract
        # (e.g. the TMA padding columns of column-major scales) then compares equal.
        outs = [(i, a[i].shape, a[i].dtype) for i, p in enumerate(params) if p["written"]]
        inputs = tuple(x for i, x in enumerate(copies(s.args)) if not params[i]["written"])
        a = copies(s.args)
        for i, _, _ in outs:
            a[i].zero_()
        mop(*a, **kw)
        want = [w.clone() for w in written(reg, op, a, s)]

        def step(*xs):
            it = iter(xs)
            full = []
            for i, p in enumerate(params):
                full.append(torch.zeros(a[i].shape, dtype=a[i].dtype, device="cuda") if p["written"] else next(it))
            mop(*full, **kw)
            return tuple(full[i].clone() for i, _, _ in outs)

    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, record, replay
        got = compiled(*inputs)
    torch.cuda.synchronize()
    skips = dict(torch._dynamo.utils.counters["inductor"]).get("cudagraph_skips", 0)
    assert skips == 0, f"{op}: CUDA graphs were skipped"
    assert_same(list(got), want[: len(got)], f"{op} under CUDA graphs")


@needs_modern
@pytest.mark.parametrize("device", DEVICES)
def test_mlp_step_compiled(reg, device, fresh_dynamo):
    # kreg-host's MLP step: fused_add_rmsnorm -> matmul -> silu_and_mul, as one graph.
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator().manual_seed(7)
    t, h, inter = 5, 256, 344
    x = torch.randn(t, h, generator=g).to(device, dt)
    res = torch.randn(t, h, generator=g).to(device, dt)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(device, dt)
    up = (torch.randn(h, 2 * inter, generator=g) / h**0.5).to(device, dt)

    def step(x, res):
        y, r = kt.ops.layernorm.fused_add_rmsnorm(x, res, w, eps=1e-6)
        return kt.ops.activation.silu_and_mul(y @ up), r

    want = step(x, res)
    assert torch._dynamo.explain(step)(x, res).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend=backend(device))(x, res)
    for gv, wv in zip(got, want):
        torch.testing.assert_close(gv, wv, atol=2e-2, rtol=2e-2)


@needs_modern
@pytest.mark.parametrize("device", DEVICES)
def test_decode_step_compiled(reg, device, fresh_dynamo):
    # A decode-attention step: q scaled by torch, kreg's paged decode, an output projection.
    s = torch_samples.samples("attention.decode", device)[0]
    names = [p["name"] for p in tensor_params(reg, "attention.decode")]
    args = dict(zip(names, s.args))
    q, rest = args["q"], functional_inputs(reg, "attention.decode", s.args)[1:]
    proj = torch.randn(q.shape[-1], q.shape[-1], generator=torch.Generator().manual_seed(3)).to(q.device, q.dtype)

    def step(q):
        o = kt.ops.attention.decode(q * 1.0, *rest, **s.kwargs)
        return o @ proj

    want = step(q)
    assert torch._dynamo.explain(step)(q).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend=backend(device))(q)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


# ---- hot reload behind the same torch op ----


def test_reload_swaps_the_code_behind_the_torch_ops(tmp_path, fresh_dynamo):
    plugins = BUILD / "tests" / "plugins"
    v1, v2, plus = (plugins / f"libkreg_testgrp{s}.so" for s in ("", "_v2", "_plus"))
    if not v1.exists():
        pytest.skip(f"the test plugins are not built ({v1})")
    d = tmp_path / "plugins"
    d.mkdir()
    os.chmod(d, 0o755)
    lib = d / "libkreg_testgrp.so"

    def place(src):
        tmp = d / ".swap.tmp"
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, lib)  # a new inode: the loader maps the new file

    place(v1)
    m = tmp_path / "testgrp.yaml"
    m.write_text(f"kreg_manifest: 1\nplugin_dir: {d}\ngroups:\n  - name: testgrp\n    library: libkreg_testgrp.so\n")
    r = kreg.open(str(m), plugin_dir=str(d))
    assert "testgrp.scale" in kt.register(r)
    x = torch.arange(6, dtype=torch.float32)

    def f(x):
        return kt.ops.testgrp.scale(x, alpha=3.0)

    fn = torch.compile(f, fullgraph=True, backend="aot_eager") if MODERN else f
    assert torch.equal(fn(x), 3 * x)
    graphs = dict(torch._dynamo.utils.counters["stats"]).get("unique_graphs", 0) if MODERN else 0
    place(v2)  # offset 1000
    assert r.reload("testgrp")["generation"] == 2
    assert torch.equal(fn(x), 3 * x + 1000)  # the same compiled function, the new code
    if MODERN:
        assert dict(torch._dynamo.utils.counters["stats"]).get("unique_graphs", 0) == graphs, "recompiled"
    out = torch.empty(6)
    torch.ops.kreg_testgrp.scale(x, out, alpha=3.0)
    assert torch.equal(out, 3 * x + 1000)
    # A reload that adds an op registers it.
    place(plus)
    report = r.reload("testgrp")
    assert report["added_ops"] == ["testgrp.negate"]
    assert torch.equal(kt.ops.testgrp.negate(x), -x)


def test_lazy_groups_register_without_loading_and_load_on_first_call(tmp_path):
    # A fresh process (torch's namespaces are process-wide and this one's are taken): every
    # group lazy, registered from the libraries' embedded metadata, loaded by its first call.
    lazy = tmp_path / "lazy.yaml"
    lazy.write_text(pathlib.Path(MANIFEST).read_text().replace("load: eager", "load: lazy"))
    code = (
        "import torch, kreg, kreg.torch as kt\n"
        f"r = kreg.open({str(lazy)!r})\n"
        "assert not any(g['loaded'] for g in r.groups())\n"
        "assert set(kt.register(r)) == set(r.list()) and len(r.list()) > 0\n"
        "assert not any(g['loaded'] for g in r.groups()), 'register loaded a group'\n"
        "x = torch.randn(2, 8)\n"
        "out = kt.ops.activation.silu_and_mul(x)\n"
        "assert torch.allclose(out, torch.nn.functional.silu(x[:, :4]) * x[:, 4:], atol=1e-5)\n"
        "assert [g['name'] for g in r.groups() if g['loaded']] == ['activation']\n"
        "print('ok')\n"
    )
    import subprocess

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
