"""Tests of the kreg Python extension (tools/python), run by ctest as `python.kreg`.

Every tensor test runs with NumPy arrays on the CPU, and again with torch CPU and torch
CUDA tensors where torch (and a GPU) exist; those variants skip with the reason otherwise.
Results are checked against NumPy float64 math written here. Run by hand:

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -q tests/python
"""

import math
import os
import pathlib
import threading

import numpy as np
import pytest

import kreg

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = os.environ.get("KREG_MANIFEST") or str(ROOT / "registry.yaml")


# ---- Tensor kinds ----

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:  # CI has no torch: the NumPy variants carry the tests there
    HAVE_TORCH = False


def _torch_cuda_reason():
    if not HAVE_TORCH:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device here"
    return None


class NumpyKind:
    name = "numpy"
    cuda = False

    def tensor(self, a):
        return np.array(a, order="C", copy=True)  # callers keep their inputs

    def empty(self, shape, dtype):
        return np.full(shape, np.nan, dtype=dtype)

    def numpy(self, t):
        return np.asarray(t)


class TorchKind:
    def __init__(self, device):
        self.device = device
        self.name = f"torch-{device}"
        self.cuda = device == "cuda"

    def tensor(self, a):
        return torch.from_numpy(np.array(a, order="C", copy=True)).to(self.device)  # a copy: in-place ops must not change the caller's inputs

    def empty(self, shape, dtype):
        dt = {np.float32: torch.float32, np.float16: torch.float16}[np.dtype(dtype).type]
        return torch.full(shape, float("nan"), dtype=dt, device=self.device)

    def numpy(self, t):
        return t.cpu().numpy()  # .cpu() waits for the current stream


def _kinds():
    yield pytest.param(NumpyKind(), id="numpy")
    yield pytest.param(
        TorchKind("cpu") if HAVE_TORCH else None,
        id="torch-cpu",
        marks=pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed"),
    )
    reason = _torch_cuda_reason()
    yield pytest.param(
        TorchKind("cuda") if reason is None else None,
        id="torch-cuda",
        marks=pytest.mark.skipif(reason is not None, reason=reason or ""),
    )


@pytest.fixture(params=list(_kinds()))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def reg():
    return kreg.open(MANIFEST)


def rng(seed=0):
    return np.random.default_rng(seed)


def randn(shape, seed=0, dtype=np.float32):
    # Non-zero, well-scaled inputs.
    return (rng(seed).standard_normal(shape) + 0.1).astype(dtype)


# ---- float64 oracles ----


def rmsnorm_ref(x, w, eps=1e-6, gemma=False):
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    scale = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * scale * ((1.0 + w) if gemma else w)


def act_ref(x, act):
    x = x.astype(np.float64)
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    if act == "silu":
        y = a / (1.0 + np.exp(-a))
    elif act == "gelu":
        erf = np.vectorize(math.erf)
        y = 0.5 * a * (1.0 + erf(a / math.sqrt(2.0)))
    else:
        y = 0.5 * a * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a**3)))
    return y * b


def close(got, want, dtype=np.float32):
    tol = 2e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


# ---- Introspection ----


def test_list_and_groups(reg):
    ops = reg.list()
    assert ops == sorted(ops)
    assert "layernorm.rmsnorm" in ops and "activation.silu_and_mul" in ops
    assert reg.list("layernorm") == [o for o in ops if o.startswith("layernorm.")]
    groups = {g["name"]: g for g in reg.groups()}
    assert groups["layernorm"]["loaded"] and groups["layernorm"]["generation"] >= 1
    with pytest.raises(kreg.NotFound, match="no group named 'nope'"):
        reg.list("nope")


def test_info(reg):
    info = reg.info("layernorm.rmsnorm")
    assert info["op"] == "layernorm.rmsnorm" and info["group"] == "layernorm"
    assert info["signature"].startswith("rmsnorm(Tensor[T,H] x")
    assert info["generation"] >= 1 and info["plugin_version"] == "0.1.0"
    assert [p["name"] for p in info["params"]] == ["x", "weight", "out", "eps"]
    eps = info["params"][3]
    assert eps["kind"] == "float" and eps["default"] == "1e-6" and not eps["required"]
    backends = [i["backend"] for i in info["implementations"]]
    assert "cpu" in backends
    for impl in info["implementations"]:
        assert {"priority", "dtypes", "capabilities", "traits", "source", "library"} <= set(impl)
    cpu = next(i for i in info["implementations"] if i["backend"] == "cpu")
    assert cpu["source"] == "reference.cpp" and cpu["available"]


def test_info_alias_and_unknown(reg):
    info = reg.info("activation.silu_mul")
    assert info["op"] == "activation.silu_and_mul" and info["alias_of"] == "activation.silu_and_mul"
    with pytest.raises(kreg.NotFound, match="unknown op 'layernorm.nope'"):
        reg.info("layernorm.nope")


def test_error_classes():
    assert issubclass(kreg.Error, RuntimeError)
    assert issubclass(kreg.InvalidArgument, kreg.Error) and issubclass(kreg.InvalidArgument, ValueError)
    assert issubclass(kreg.NotFound, kreg.Error) and issubclass(kreg.NotFound, LookupError)


def test_open_errors(tmp_path):
    with pytest.raises(kreg.Error, match="does-not-exist.yaml"):
        kreg.open(str(tmp_path / "does-not-exist.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("kreg_manifest: 1\ngroups: 3\n")
    with pytest.raises(kreg.Error):
        kreg.open(str(bad))


def test_unknown_op(reg):
    with pytest.raises(kreg.NotFound, match="unknown op 'layernorm.nope'"):
        reg.op("layernorm.nope")
    with pytest.raises(kreg.NotFound):
        reg.op("nope")
    with pytest.raises(AttributeError, match="layernorm.nope"):
        reg.ops.layernorm.nope
    with pytest.raises(AttributeError, match="no group 'nope'"):
        reg.ops.nope


def test_unknown_backend(reg):
    with pytest.raises(kreg.NotFound, match="no 'tpu' implementation"):
        reg.op("layernorm.rmsnorm", backend="tpu")


def test_ops_namespace(reg):
    op = reg.ops.layernorm.rmsnorm
    assert isinstance(op, kreg.Op) and op.id == "layernorm.rmsnorm"
    assert reg.ops.layernorm.rmsnorm is op  # cached
    assert "rmsnorm" in dir(reg.ops.layernorm) and "activation" in dir(reg.ops)
    assert op.signature == reg.info("layernorm.rmsnorm")["signature"]
    assert op.resolved_backend is None or isinstance(op.resolved_backend, str)


def test_handle_outlives_registry():
    op = kreg.open(MANIFEST).op("activation.silu_and_mul")  # the registry object is dropped
    x = randn((2, 8))
    out = np.empty((2, 4), np.float32)
    op(x, out)
    close(out, act_ref(x, "silu"))


# ---- Calls ----


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(1, 7), (5, 64), (3, 4097)])
def test_rmsnorm(reg, kind, dtype, shape):
    x = randn(shape, 1, dtype)
    w = randn(shape[-1:], 2, dtype)
    xt, wt, out = kind.tensor(x), kind.tensor(w), kind.empty(shape, dtype)
    reg.op("layernorm.rmsnorm")(xt, wt, out, eps=1e-5)
    close(kind.numpy(out), rmsnorm_ref(x, w, 1e-5), dtype)
    reg.ops.layernorm.gemma_rmsnorm(xt, wt, out)  # eps defaults to 1e-6
    close(kind.numpy(out), rmsnorm_ref(x, w, 1e-6, gemma=True), dtype)


def test_attribute_int_and_numpy_scalar(reg, kind):
    x, w = randn((2, 16), 3), randn((16,), 4)
    xt, wt, out = kind.tensor(x), kind.tensor(w), kind.empty((2, 16), np.float32)
    op = reg.op("layernorm.rmsnorm")
    op(xt, wt, out, eps=1)  # an int for a float attribute
    close(kind.numpy(out), rmsnorm_ref(x, w, 1.0))
    op(xt, wt, out, eps=np.float32(0.5))
    close(kind.numpy(out), rmsnorm_ref(x, w, 0.5))


def test_attribute_out_of_range_names_op_attribute_and_range(reg):
    x, w = randn((2, 16), 3), randn((16,), 4)
    out = np.empty((2, 16), np.float32)
    op = reg.op("layernorm.rmsnorm")
    with pytest.raises(kreg.InvalidArgument,
                       match=r"layernorm.rmsnorm\(\): attribute 'eps' is too large for a float"):
        op(x, w, out, eps=10**400)
    for bad in (float("inf"), float("-inf"), float("nan"), np.float64("nan"), np.float32("inf")):
        with pytest.raises(kreg.InvalidArgument,
                           match="layernorm.rmsnorm\\(\\): attribute 'eps' must be a finite float"):
            op(x, w, out, eps=bad)
    grouped = reg.op("moe.grouped_topk")
    gating, bias = randn((4, 8), 5), np.zeros(8, np.float32)
    ow, oi = np.empty((4, 2), np.float32), np.empty((4, 2), np.int32)
    for bad in (2**63, -(2**63) - 1, 10**30):
        with pytest.raises(kreg.InvalidArgument,
                           match=r"moe.grouped_topk\(\): attribute 'n_group' is out of range "
                                 r"\[-9223372036854775808, 9223372036854775807\] \(int64\)") as info:
            grouped(gating, bias, ow, oi, n_group=bad, topk_group=1)
        assert info.value.code == "INVALID_ARGUMENT"
    # bool attributes take only bool: 1 is not silently True.
    topk = reg.op("moe.topk_softmax")
    with pytest.raises(TypeError, match="attribute 'renormalize' must be bool, not int"):
        topk(gating, None, ow, oi, renormalize=1)
    # The handle still works after every failure.
    op(x, w, out, eps=1e-6)
    close(out, rmsnorm_ref(x, w))


def test_nul_in_a_string_attribute_or_path_is_refused(reg):
    route = reg.op("moe.route")
    gating = randn((4, 8), 5)
    ow, oi = np.empty((4, 2), np.float32), np.empty((4, 2), np.int32)
    with pytest.raises(kreg.InvalidArgument,
                       match=r"moe.route\(\): attribute 'method' contains a NUL character"):
        route(gating, None, ow, oi, method="Default\0ignored")
    with pytest.raises(kreg.InvalidArgument, match="the manifest path contains a NUL character"):
        kreg.open(MANIFEST + "\0ignored")
    with pytest.raises(kreg.InvalidArgument, match="plugin_dir contains a NUL character"):
        kreg.open(MANIFEST, plugin_dir="/tmp\0ignored")


@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm_in_place(reg, kind, gemma):
    x, r, w = randn((3, 96), 5), randn((3, 96), 6), randn((96,), 7)
    xt, rt, wt = kind.tensor(x), kind.tensor(r), kind.tensor(w)
    name = "gemma_fused_add_rmsnorm" if gemma else "fused_add_rmsnorm"
    getattr(reg.ops.layernorm, name)(xt, rt, wt, eps=1e-6)
    s = x.astype(np.float64) + r
    close(kind.numpy(rt), s)
    close(kind.numpy(xt), rmsnorm_ref(s, w, 1e-6, gemma=gemma))


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("shape", [(1, 2), (4, 14), (2, 258)])
def test_act_and_mul(reg, kind, act, shape):
    x = randn(shape, 8)
    out = kind.empty((shape[0], shape[1] // 2), np.float32)
    reg.op(f"activation.{act}_and_mul")(kind.tensor(x), out)
    close(kind.numpy(out), act_ref(x, act))


def test_zero_tokens(reg, kind):
    x = np.zeros((0, 8), np.float32)
    out = kind.empty((0, 4), np.float32)
    reg.ops.activation.silu_and_mul(kind.tensor(x), out)


def test_alias_handle(reg, kind):
    x = randn((2, 8), 9)
    out = kind.empty((2, 4), np.float32)
    reg.op("activation.silu_mul")(kind.tensor(x), out)
    close(kind.numpy(out), act_ref(x, "silu"))


def test_one_handle_many_dtypes(reg, kind):
    # The resolution cache follows (device, dtype): switching back and forth works.
    op = reg.op("layernorm.rmsnorm")
    for dtype in (np.float32, np.float16, np.float32):
        x, w = randn((2, 32), 10, dtype), randn((32,), 11, dtype)
        out = kind.empty((2, 32), dtype)
        op(kind.tensor(x), kind.tensor(w), out)
        close(kind.numpy(out), rmsnorm_ref(x, w), dtype)


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_parameter_grad_and_views(reg, device):
    # torch hands kreg its tensors through the DLPack C exchange API where it has one
    # (torch >= 2.10): subclasses (nn.Parameter), tensors that require grad, and views with
    # an offset into their storage must all arrive as the same memory.
    if device == "cuda" and _torch_cuda_reason() is not None:
        pytest.skip(_torch_cuda_reason())
    op = reg.op("layernorm.rmsnorm")
    x_np, w_np = randn((3, 40), 21), randn((40,), 22)
    big = torch.from_numpy(np.concatenate([randn((2, 40), 23), x_np])).to(device)
    x = big[2:]  # a view 80 elements into its storage
    w = torch.nn.Parameter(torch.from_numpy(w_np).to(device))  # requires grad
    out = torch.full((3, 40), float("nan"), device=device)
    op(x, w, out)
    close(out.cpu().numpy(), rmsnorm_ref(x_np, w_np))
    with pytest.raises(kreg.InvalidArgument, match="not contiguous"):
        op(torch.from_numpy(randn((40, 3), 24)).to(device).t(), w, out)  # strides (1, 3)


def test_stream_keyword(reg, kind):
    x = randn((2, 8), 12)
    out = kind.empty((2, 4), np.float32)
    op = reg.op("activation.silu_and_mul")
    if kind.cuda:
        s = torch.cuda.Stream()
        xt = kind.tensor(x)
        s.wait_stream(torch.cuda.current_stream())
        op(xt, out, stream=s)  # an object with .cuda_stream
        s.synchronize()
        close(kind.numpy(out), act_ref(x, "silu"))
        op(xt, out, stream=torch.cuda.current_stream().cuda_stream)  # an int
    else:
        op(kind.tensor(x), out, stream=None)
        op(kind.tensor(x), out, stream=0)  # ignored by CPU kernels
    close(kind.numpy(out), act_ref(x, "silu"))
    with pytest.raises(TypeError, match="stream="):
        op(kind.tensor(x), out, stream="default")


def test_hot_reload_visible(reg, kind):
    r = kreg.open(MANIFEST)
    op = r.op("activation.silu_and_mul")
    before = r.info("activation.silu_and_mul")["generation"]
    report = r.reload("activation")
    assert report["group"] == "activation" and report["generation"] == before + 1
    info = r.info("activation.silu_and_mul")
    assert info["generation"] == before + 1 and info["plugin_version"] == report["version"]
    x = randn((2, 8), 13)
    out = kind.empty((2, 4), np.float32)
    op(kind.tensor(x), out)  # a handle from before the swap runs the new code
    close(kind.numpy(out), act_ref(x, "silu"))
    with pytest.raises(kreg.Error):
        r.reload("nope")


def test_precheck_in_a_threaded_interpreter_runs_kreg_probe(monkeypatch):
    # The pre-check's child is kreg-probe (found beside the module's libkreg), a fresh
    # process: it works while another thread holds a lock, with torch imported and CUDA
    # initialized where there is a GPU. A multithreaded process that finds no kreg-probe
    # refuses the pre-check rather than fork, so this also shows that it was found.
    if HAVE_TORCH and torch.cuda.is_available():
        torch.zeros(1, device="cuda")
    lock, release = threading.Lock(), threading.Event()

    def hold():
        with lock:
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        r = kreg.open(MANIFEST, precheck=True)
        before = r.info("activation.silu_and_mul")["generation"]
        report = r.reload("activation", precheck=True)
        assert report["generation"] == before + 1
        # KREG_PROBE is read at each probe, and an unusable one is named, never replaced.
        monkeypatch.setenv("KREG_PROBE", "/nonexistent/kreg-probe")
        with pytest.raises(kreg.Error, match="KREG_PROBE=/nonexistent/kreg-probe does not exist"):
            r.reload("activation", precheck=True)
        assert r.info("activation.silu_and_mul")["generation"] == before + 1
    finally:
        release.set()
        holder.join()


# ---- Bad input: clear Python exceptions, never a crash ----


def bad_call_cases(kind):
    x, w = kind.tensor(randn((2, 16))), kind.tensor(randn((16,)))
    out = kind.empty((2, 16), np.float32)
    x64 = kind.tensor(randn((2, 16)).astype(np.float64))
    x16 = kind.tensor(randn((2, 16)).astype(np.float16))
    x3 = kind.tensor(randn((2, 2, 16)))
    wide = kind.tensor(randn((2, 32)))
    noncontig = wide[:, ::2]
    return [
        ("too few tensors", (x, w), {}, TypeError, "takes 3 tensors \\(x, weight, out\\)"),
        ("too many tensors", (x, w, out, out), {}, TypeError, "got 4"),
        ("no tensors", (), {}, TypeError, "got 0"),
        ("unknown keyword", (x, w, out), {"epsilon": 1e-6}, TypeError, "'epsilon'"),
        ("attribute type", (x, w, out), {"eps": "small"}, TypeError, "'eps' must be float"),
        ("bool for float", (x, w, out), {"eps": True}, TypeError, "'eps' must be float"),
        ("not a tensor", (x, 3.0, out), {}, TypeError, "argument 2 \\(weight\\)"),
        ("None tensor", (None, w, out), {}, TypeError, "argument 1 \\(x\\)"),
        # None is an omitted optional tensor ('Tensor?'); weight is required.
        ("None for a required tensor", (x, None, out), {}, kreg.InvalidArgument, "weight"),
        ("a list", (x, w, [1.0] * 16), {}, TypeError, "argument 3 \\(out\\)"),
        ("wrong dtype", (x64, kind.tensor(randn((16,)).astype(np.float64)), out), {},
         kreg.InvalidArgument, "dtype f64"),
        ("mixed dtypes", (x16, w, out), {}, kreg.InvalidArgument, "weight"),
        ("wrong rank", (x3, w, out), {}, kreg.InvalidArgument, "x"),
        ("shape mismatch", (x, kind.tensor(randn((8,))), out), {}, kreg.InvalidArgument, "weight"),
        ("non-contiguous", (noncontig, w, out), {}, kreg.InvalidArgument, "not contiguous"),
    ]


def test_bad_calls(reg, kind):
    op = reg.op("layernorm.rmsnorm")
    for label, args, kwargs, exc, pattern in bad_call_cases(kind):
        with pytest.raises(exc, match=pattern) as info:
            op(*args, **kwargs)
        if isinstance(info.value, kreg.Error):
            assert info.value.code == "INVALID_ARGUMENT", label
            assert "layernorm.rmsnorm" in str(info.value), label
    # The handle still works after every failure.
    x, w = randn((2, 16), 14), randn((16,), 15)
    out = kind.empty((2, 16), np.float32)
    op(kind.tensor(x), kind.tensor(w), out)
    close(kind.numpy(out), rmsnorm_ref(x, w))


def test_bad_calls_on_a_fresh_handle(reg, kind):
    # Errors on the first call (before anything is cached) come from resolution.
    for label, args, kwargs, exc, pattern in bad_call_cases(kind):
        with pytest.raises(exc, match=pattern):
            reg.op("layernorm.rmsnorm")(*args, **kwargs)


def test_missing_keyword_positional_attr(reg):
    x, w, out = randn((2, 16)), randn((16,)), np.empty((2, 16), np.float32)
    with pytest.raises(TypeError, match="takes 3 tensors"):
        reg.op("layernorm.rmsnorm")(x, w, out, 1e-6)  # attributes are keywords


def test_readonly_numpy_array(reg):
    x = randn((2, 8))
    x.setflags(write=False)  # NumPy refuses to export read-only arrays through DLPack
    with pytest.raises(Exception) as info:
        reg.op("activation.silu_and_mul")(x, np.empty((2, 4), np.float32))
    assert not isinstance(info.value, SystemError)


@pytest.mark.skipif(_torch_cuda_reason() is not None, reason=_torch_cuda_reason() or "")
def test_cpu_tensor_to_cuda_backend(reg):
    x = torch.randn(2, 8)
    out = torch.empty(2, 4)
    with pytest.raises(kreg.Error):
        reg.op("activation.silu_and_mul", backend="cuda")(x, out)
    with pytest.raises(kreg.InvalidArgument):  # devices differ
        reg.op("activation.silu_and_mul")(x.cuda(), out)


@pytest.mark.skipif(_torch_cuda_reason() is not None, reason=_torch_cuda_reason() or "")
def test_cuda_graph_capture(reg):
    # kreg calls on torch's current stream are captured like torch's own kernels.
    op = reg.op("activation.silu_and_mul")
    x = torch.randn(4, 64, device="cuda")
    out = torch.empty(4, 32, device="cuda")
    op(x, out)  # warm up (resolution) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        op(x, out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    close(out.cpu().numpy(), act_ref(x.cpu().numpy(), "silu"))


def test_alias_chains_resolve_everywhere(tmp_path, kind):
    # v1 -> v2 -> v3 -> activation.silu_and_mul: op(), ops.x.y and info() follow the chain.
    plugin_dir = kreg.open(MANIFEST).plugin_dir
    m = tmp_path / "chain.yaml"
    m.write_text(
        "kreg_manifest: 1\n"
        f"plugin_dir: {plugin_dir}\n"
        "groups:\n"
        "  - name: activation\n"
        "    library: libkreg_activation.so\n"
        "aliases:\n"
        "  - {from: activation.v1, to: activation.v2, message: \"use silu_and_mul\"}\n"
        "  - {from: activation.v2, to: activation.v3}\n"
        "  - {from: activation.v3, to: activation.silu_and_mul}\n"
    )
    r = kreg.open(str(m), plugin_dir=plugin_dir)
    info = r.info("activation.v1")
    assert info["op"] == "activation.silu_and_mul"
    assert info["alias_of"] == "activation.silu_and_mul"
    assert info["alias_chain"] == [
        "activation.v1", "activation.v2", "activation.v3", "activation.silu_and_mul"]
    assert info["deprecation"] == "use silu_and_mul"
    x = randn((2, 8), 12)
    for op in (r.op("activation.v1"), r.op("activation.v2"), r.ops.activation.v1):
        assert op.id == "activation.silu_and_mul"
        out = kind.empty((2, 4), np.float32)
        op(kind.tensor(x), out)
        close(kind.numpy(out), act_ref(x, "silu"))


# ---- Workspace from torch's caching allocator ----


def _align_inputs(tokens, k, experts, block, seed):
    ids = rng(seed).integers(0, experts, size=(tokens, k), dtype=np.int32)
    padded = tokens * k + experts * (block - 1)
    blocks = (padded + block - 1) // block
    return ids, padded, blocks


def _align_outputs(padded, blocks, empty):
    return empty((padded,)), empty((blocks,)), empty((1,))


@pytest.mark.skipif(_torch_cuda_reason() is not None, reason=_torch_cuda_reason() or "")
def test_workspace_comes_from_torchs_caching_allocator(reg, monkeypatch):
    # moe.align_block_size takes scratch memory (E * chunks ints) when T*k spans 9 or more
    # chunks of 512 slots; with torch tensors it must come from torch.cuda's caching
    # allocator on the call's stream and go back to it, and the results must not change.
    tokens, k, experts, block = 2048, 8, 64, 16  # 16384 slots: 32 chunks
    ids, padded, blocks = _align_inputs(tokens, k, experts, block, 31)

    # The CPU reference on NumPy arrays: no torch involved.
    cpu = _align_outputs(padded, blocks, lambda s: np.full(s, -77, dtype=np.int32))
    reg.op("moe.align_block_size", backend="cpu")(ids, *cpu, num_experts=experts, block_size=block)

    calls = {"alloc": [], "delete": []}
    real_alloc = torch.cuda.caching_allocator_alloc
    real_delete = torch.cuda.caching_allocator_delete

    def counting_alloc(size, device=None, stream=None):
        calls["alloc"].append((size, device, stream))
        ptr = real_alloc(size, device, stream)
        calls["alloc_ptr"] = ptr
        return ptr

    def counting_delete(ptr):
        calls["delete"].append(ptr)
        return real_delete(ptr)

    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc", counting_alloc)
    monkeypatch.setattr(torch.cuda, "caching_allocator_delete", counting_delete)

    stream = torch.cuda.Stream()  # not the default stream: the allocation must name it
    gpu = _align_outputs(
        padded, blocks, lambda s: torch.full(s, -77, dtype=torch.int32, device="cuda")
    )
    ids_gpu = torch.from_numpy(ids).cuda()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    with torch.cuda.stream(stream):
        reg.op("moe.align_block_size", backend="cuda")(
            ids_gpu, *gpu, num_experts=experts, block_size=block
        )
    stream.synchronize()
    after = torch.cuda.memory_stats()["allocation.all.allocated"]

    chunks = (tokens * k + 511) // 512
    assert len(calls["alloc"]) == 1, calls
    size, device, alloc_stream = calls["alloc"][0]
    # One row of counts per chunk, each row E rounded up to whole 16-byte vectors, and 16
    # bytes to round the pointer up (plugins/moe/align.cu).
    row = (experts + 3) // 4 * 4
    assert size == row * chunks * 4 + 16
    assert device == 0
    assert alloc_stream == stream.cuda_stream
    assert calls["delete"] == [calls["alloc_ptr"]]
    assert after == before + 1  # torch's own count of allocations saw it
    for got, want in zip(gpu, cpu):
        np.testing.assert_array_equal(got.cpu().numpy(), want)


@pytest.mark.skipif(_torch_cuda_reason() is not None, reason=_torch_cuda_reason() or "")
def test_torch_allocator_failure_is_a_kreg_error(reg, monkeypatch):
    # An exception in torch's allocator becomes the call's error message (no exception
    # crosses the C ABI, none is left pending).
    def refusing_alloc(size, device=None, stream=None):
        raise RuntimeError("no memory for kreg today")

    monkeypatch.setattr(torch.cuda, "caching_allocator_alloc", refusing_alloc)
    ids, padded, blocks = _align_inputs(2048, 8, 64, 16, 32)
    gpu = _align_outputs(
        padded, blocks, lambda s: torch.full(s, -77, dtype=torch.int32, device="cuda")
    )
    with pytest.raises(kreg.Error, match="no memory for kreg today"):
        reg.op("moe.align_block_size", backend="cuda")(
            torch.from_numpy(ids).cuda(), *gpu, num_experts=64, block_size=16
        )


def test_align_block_size_without_torch_needs_no_allocator(reg):
    # NumPy arrays (no torch tensor, so no host allocator is offered): the padded layout
    # against a NumPy oracle.
    ids, padded, blocks = _align_inputs(7, 3, 5, 4, 33)
    out = _align_outputs(padded, blocks, lambda s: np.full(s, -77, dtype=np.int32))
    reg.op("moe.align_block_size", backend="cpu")(ids, *out, num_experts=5, block_size=4)
    sorted_ids, expert_ids, total = out
    flat = ids.reshape(-1)
    pos = 0
    for e in range(5):
        slots = np.nonzero(flat == e)[0]
        seg = -(-len(slots) // 4) * 4
        np.testing.assert_array_equal(sorted_ids[pos : pos + len(slots)], slots)
        assert (sorted_ids[pos + len(slots) : pos + seg] == flat.size).all()
        assert (expert_ids[pos // 4 : (pos + seg) // 4] == e).all()
        pos += seg
    assert total[0] == pos


def test_set_pdl_sets_the_launch_flags_every_cuda_call_carries():
    # KREG_LAUNCH_PDL = 1, KREG_LAUNCH_STABLE_INPUTS = 2 (abi.h); stable inputs mean
    # nothing without PDL, so asking for them alone is an error that changes nothing.
    try:
        kreg.set_pdl(True)
        assert kreg.pdl() and kreg._kreg.launch_flags() == 1
        kreg.set_pdl(True, stable_inputs=True)
        assert kreg.pdl() and kreg._kreg.launch_flags() == 3
        with pytest.raises(ValueError, match="stable_inputs needs enabled=True"):
            kreg.set_pdl(False, stable_inputs=True)
        assert kreg._kreg.launch_flags() == 3
        # A flag is True or False (0 and 1 too): "no" or a stray number is refused, and
        # changes nothing.
        for bad in ("no", "yes", 10**30, 2, -1, 0.5, float("nan"), None, [1]):
            with pytest.raises(TypeError, match="must be True or False"):
                kreg.set_pdl(bad)
            with pytest.raises(TypeError, match="must be True or False"):
                kreg.set_pdl(True, stable_inputs=bad)
        assert kreg._kreg.launch_flags() == 3
        kreg.set_pdl(1, stable_inputs=0)
        assert kreg._kreg.launch_flags() == 1
    finally:
        kreg.set_pdl(False)
    assert not kreg.pdl() and kreg._kreg.launch_flags() == 0


# ---- Outside values in messages: escaped and shortened, a NUL refused ----


def _plain_and_short(text, limit=300):
    """kreg's message for an outside value: no control character, at most `limit` chars."""
    assert len(text) <= limit, f"{len(text)} characters: {text[:120]!r}..."
    assert all(c == "\n" or (" " <= c and c != "\x7f") for c in text), repr(text)


def test_reload_quotes_a_hostile_group_name_and_refuses_a_nul(reg):
    with pytest.raises(kreg.NotFound, match=r"unknown group '\\x1b\[31m'") as info:
        reg.reload("\x1b[31m")
    _plain_and_short(str(info.value))
    with pytest.raises(kreg.NotFound) as info:
        reg.reload("a" * 10**6)
    _plain_and_short(str(info.value))
    assert "(1000000 bytes)" in str(info.value)
    # Not cut at the NUL (that would name the loaded group 'layernorm'): refused.
    with pytest.raises(kreg.InvalidArgument, match="contains a NUL character") as info:
        reg.reload("layernorm\0junk")
    _plain_and_short(str(info.value))
    assert info.value.code == "INVALID_ARGUMENT"


def test_ops_attribute_errors_quote_the_name_escaped_and_short(reg):
    for get in (lambda: getattr(reg.ops, "\x1b[31m"),
                lambda: getattr(reg.ops, "a" * 10**6),
                lambda: getattr(reg.ops, "x\ud800y"),
                lambda: getattr(reg.ops.layernorm, "rms\0norm"),
                lambda: getattr(reg.ops.layernorm, "\x1b]0;title\x07"),
                lambda: getattr(reg.ops.layernorm, "a" * 10**6)):
        with pytest.raises(AttributeError) as info:
            get()
        _plain_and_short(str(info.value))
    with pytest.raises(AttributeError, match=r"no group '\\x1b\[31m'"):
        getattr(reg.ops, "\x1b[31m")
    with pytest.raises(AttributeError, match=r"no op 'layernorm.rms\\0norm'"):
        getattr(reg.ops.layernorm, "rms\0norm")


def test_open_quotes_a_huge_manifest_path_short(tmp_path):
    with pytest.raises(kreg.Error) as info:
        kreg.open("a" * 10**6)
    _plain_and_short(str(info.value), 600)
    assert "cannot read the manifest" in str(info.value) and "bytes)" in str(info.value)
    with pytest.raises(kreg.Error, match=r"\\x1b") as info:
        kreg.open(str(tmp_path / "\x1b[31m.yaml"))
    _plain_and_short(str(info.value), 600)


def test_stream_out_of_range_names_the_argument(reg):
    x = randn((2, 8), 12)
    out = np.empty((2, 4), np.float32)
    op = reg.op("activation.silu_and_mul")
    for bad in (2**70, -(2**70)):
        with pytest.raises(OverflowError, match="stream="):
            op(x, out, stream=bad)

    class Stream:
        cuda_stream = 2**64

    with pytest.raises(OverflowError, match="stream="):
        op(x, out, stream=Stream())
    op(x, out, stream=0)  # the handle still works


def test_float_attribute_refuses_arrays_takes_0d_scalars(reg):
    x, w = randn((2, 16), 3), randn((16,), 4)
    out = np.empty((2, 16), np.float32)
    op = reg.op("layernorm.rmsnorm")
    for bad in (np.array([1.0]), np.array([[0.5]]), np.array([1.0], np.float32)):
        with pytest.raises(TypeError, match=r"attribute 'eps' must be float, not .*array"):
            op(x, w, out, eps=bad)
    for good in (np.array(0.5), np.float32(0.5), np.float64(0.5), 0.5):
        op(x, w, out, eps=good)
        close(out, rmsnorm_ref(x, w, 0.5))
