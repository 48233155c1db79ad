"""Tests of resources from Python, run by ctest as `python.resources`: kreg.Resource
(kreg.Registry.create_resource, reset, with, garbage collection, errors), ops that take a
Resource<...> parameter through kreg.Op, and through kreg.torch's torch ops (which take
the resource's id) where torch and kreg._torch are there. Uses the shipped communication
group (a world-of-one comm needs no store and no GPU; two ranks in one process meet
through a file store) and the resgrp test plugin (tests/fixtures/plugins/resgrp.cpp:
counters whose creates and destroys it counts, a second type for type errors, a v2 that
tags its results for hot swaps). Run by hand:

    PYTHONPATH=build/python KREG_PLUGIN_DIR=build/plugins KREG_BUILD_DIR=build \\
        /usr/bin/python3 -m pytest -q tests/python/test_resources.py
"""

import gc
import os
import pathlib
import shutil
import sys
import threading
import time

import numpy as np
import pytest

import kreg

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFEST = os.environ.get("KREG_MANIFEST") or str(ROOT / "registry.yaml")
BUILD = pathlib.Path(os.environ.get("KREG_BUILD_DIR") or ROOT / "build")
COMM = "communication.comm"


@pytest.fixture(scope="module")
def reg():
    return kreg.open(MANIFEST)


def live(reg, type=COMM):
    return next(t["live"] for t in reg.resource_types() if t["type"] == type)


class ResGrp:
    """A registry over a private copy of the resgrp test plugin (replaceable for reloads)."""

    def __init__(self, tmp_path):
        plugins = BUILD / "tests" / "plugins"
        self.v1, self.v2 = plugins / "libkreg_resgrp.so", plugins / "libkreg_resgrp_v2.so"
        if not self.v1.exists():
            pytest.skip(f"the test plugins are not built ({self.v1})")
        self.dir = tmp_path / "plugins"
        self.dir.mkdir()
        self.place(self.v1)
        m = tmp_path / "resgrp.yaml"
        m.write_text(f"kreg_manifest: 1\nplugin_dir: {self.dir}\ngroups:\n  - name: resgrp\n    library: libkreg_resgrp.so\n")
        self.reg = kreg.open(str(m), plugin_dir=str(self.dir))

    def place(self, src):
        tmp = self.dir / ".swap.tmp"
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, self.dir / "libkreg_resgrp.so")  # a new inode: the loader maps it anew

    def next(self, counter, **kw):
        out = np.zeros(1, np.int64)
        self.reg.op("resgrp.next")(out, counter, **kw)
        return int(out[0])

    def stats(self):
        """(created, destroyed) by the current generation's library."""
        out = np.zeros(2, np.int64)
        self.reg.op("resgrp.stats")(out)
        return tuple(int(v) for v in out)


@pytest.fixture
def resgrp(tmp_path):
    return ResGrp(tmp_path)


# ---- kreg.Resource ----


def test_resource_types_lists_the_comm(reg):
    (t,) = [t for t in reg.resource_types() if t["type"] == COMM]
    assert t["signature"].startswith("comm(int rank=0, int world_size=1, str store=")
    assert "communicator" in t["description"]
    group = next(g for g in reg.groups() if g["name"] == "communication")
    assert t["generation"] == group["generation"] >= 1
    assert set(t) == {"type", "signature", "description", "generation", "live"}
    params = {p["name"]: p for p in reg.info("communication.all_reduce")["params"]}
    assert params["comm"]["kind"] == "Resource" and params["comm"]["resource_type"] == COMM
    assert params["comm"]["required"]


def test_create_reset_and_properties(reg):
    before = live(reg)
    c = reg.create_resource(COMM)
    assert isinstance(c, kreg.Resource)
    assert c.type == COMM and c.valid and c.id >= 1
    assert c.generation == next(g["generation"] for g in reg.groups() if g["name"] == "communication")
    assert repr(c) == f"<kreg.Resource {c.id} {COMM} generation {c.generation}>"
    assert live(reg) == before + 1
    d = reg.create_resource(COMM, timeout_s=5)  # an int-valued float parameter: converted
    assert d.id > c.id
    c.reset()
    assert not c.valid and c.id >= 1 and c.type == COMM  # the id stays: errors name it
    assert repr(c).endswith(" destroyed>")
    assert live(reg) == before + 1
    c.reset()  # a second reset is a no-op
    d.reset()
    assert live(reg) == before
    with pytest.raises(TypeError):
        kreg.Resource()  # only a registry creates them


def test_with_block_destroys_also_on_error(reg):
    before = live(reg)
    with reg.create_resource(COMM) as c:
        assert c.valid and live(reg) == before + 1
    assert not c.valid and live(reg) == before
    with pytest.raises(ZeroDivisionError):
        with reg.create_resource(COMM) as c:
            1 / 0
    assert not c.valid and live(reg) == before


def test_garbage_collection_destroys(resgrp):
    created, destroyed = resgrp.stats()
    c = resgrp.reg.create_resource("resgrp.counter", start=5)
    assert resgrp.stats() == (created + 1, destroyed)
    del c  # the last reference
    assert resgrp.stats() == (created + 1, destroyed + 1)
    # In a reference cycle: the cycle collector destroys it.
    cycle = [resgrp.reg.create_resource("resgrp.counter")]
    cycle.append(cycle)
    del cycle
    gc.collect()
    assert resgrp.stats() == (created + 2, destroyed + 2)


def test_a_resource_keeps_its_registry_alive(tmp_path):
    r = ResGrp(tmp_path)
    registry = r.reg
    refs = sys.getrefcount(registry)
    c = registry.create_resource("resgrp.counter", start=3, step=2)
    after = sys.getrefcount(registry)  # not inside the assert: pytest's rewrite holds values
    assert after == refs + 1
    del registry
    op = r.reg.op("resgrp.next")
    del r  # the registry lives on through c (and op)
    gc.collect()
    out = np.zeros(1, np.int64)
    op(out, c)
    assert out[0] == 3 and c.valid
    c.reset()
    assert not c.valid


def test_creation_errors(reg, resgrp):
    before = live(reg)
    with pytest.raises(kreg.InvalidArgument, match=r"communication.comm: unknown parameter 'wrld' \(parameters: rank, world_size"):
        reg.create_resource(COMM, wrld=2)
    with pytest.raises(TypeError, match=r"communication.comm: parameter 'rank' must be int, got str"):
        reg.create_resource(COMM, rank="0")
    with pytest.raises(TypeError, match=r"parameter 'world_size' must be int, got bool"):
        reg.create_resource(COMM, world_size=True)
    with pytest.raises(TypeError, match=r"parameter 'store' must be str, got list"):
        reg.create_resource(COMM, store=["x"])
    with pytest.raises(TypeError, match=r"parameter 'timeout_s' must be float, got str"):
        reg.create_resource(COMM, timeout_s="5")
    with pytest.raises(kreg.InvalidArgument, match=r"parameter 'rank' is out of range .* \(int64\)"):
        reg.create_resource(COMM, rank=2**63)
    with pytest.raises(kreg.InvalidArgument, match=r"parameter 'name' contains a NUL character"):
        reg.create_resource(COMM, name="a\0b")
    with pytest.raises(kreg.InvalidArgument, match=r"create failed: .*a store URL .* is needed for world size 2"):
        reg.create_resource(COMM, world_size=2)
    with pytest.raises(kreg.NotFound, match=r"declares no resource type 'communication.nope' \(it declares: communication.comm\)"):
        reg.create_resource("communication.nope")
    with pytest.raises(kreg.NotFound, match=r"no group 'nope'"):
        reg.create_resource("nope.comm")
    with pytest.raises(kreg.InvalidArgument, match=r"not of the form <group>.<name>"):
        reg.create_resource("comm")
    with pytest.raises(kreg.InvalidArgument, match=r"NUL"):
        reg.create_resource("communication.comm\0x")
    # The plugin's own refusals, with its status code.
    with pytest.raises(kreg.InvalidArgument, match=r"counter: step must not be 0"):
        resgrp.reg.create_resource("resgrp.counter", step=0)
    with pytest.raises(kreg.Error, match=r"counter: asked to fail") as e:
        resgrp.reg.create_resource("resgrp.counter", label="fail")
    assert e.value.code == "UNAVAILABLE"
    assert live(reg) == before  # nothing half-created is left
    assert resgrp.stats()[0] == 0  # the plugin created no counter


# ---- kreg.Op calls ----


def test_op_takes_the_resource_positionally_or_by_keyword(reg):
    all_reduce = reg.op("communication.all_reduce")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = x.copy()
    with reg.create_resource(COMM) as comm:
        all_reduce(x, comm)
        all_reduce(x, comm=comm, op="max")
        reg.ops.communication.all_reduce(x, comm, op="avg")
        assert np.array_equal(x, want)
        out = np.full(12, np.nan, np.float32)
        reg.op("communication.all_gather")(x, out, comm)
        assert np.array_equal(out, x.ravel())


def test_op_argument_errors(reg):
    all_reduce = reg.op("communication.all_reduce")
    x = np.zeros(4, np.float32)
    with reg.create_resource(COMM) as comm:
        for bad, name in ((3, "int"), ("comm", "str"), (None, "NoneType"), (x, "numpy.ndarray")):
            with pytest.raises(TypeError, match=rf"^communication.all_reduce\(\): comm must be a kreg.Resource of type communication.comm, got {name}$"):
                all_reduce(x, comm=bad)
            with pytest.raises(TypeError, match=r"comm must be a kreg.Resource"):
                all_reduce(x, bad)
        with pytest.raises(TypeError, match=r"missing required attribute 'comm'"):
            all_reduce(x)
        with pytest.raises(TypeError, match=r"missing required attribute 'comm'"):
            all_reduce(x, op="sum")
        with pytest.raises(TypeError, match=r"got multiple values for 'comm'"):
            all_reduce(x, comm, comm=comm)
        with pytest.raises(TypeError, match=r"takes 1 tensor \(x\) and then up to 1 resource \(comm\) as positional arguments, got 3"):
            all_reduce(x, comm, comm)
        with pytest.raises(TypeError, match=r"attribute 'op' must be str, not kreg.Resource"):
            all_reduce(x, comm, op=comm)
    # Ops without resources take tensors only, positionally.
    with pytest.raises(TypeError, match=r"takes 3 tensors \(x, weight, out\) as positional arguments, got 4"):
        reg.op("layernorm.rmsnorm")(x, x, x, x)


def test_a_destroyed_resource_is_refused(reg):
    all_reduce = reg.op("communication.all_reduce")
    x = np.ones(4, np.float32)
    comm = reg.create_resource(COMM)
    all_reduce(x, comm)
    comm.reset()
    with pytest.raises(kreg.Error, match=rf"communication.all_reduce .*: attribute 'comm': resource {comm.id} \(communication.comm\) was destroyed"):
        all_reduce(x, comm)


def test_a_resource_of_another_type_is_refused(resgrp):
    other = resgrp.reg.create_resource("resgrp.other")
    with pytest.raises(kreg.Error, match=r"resgrp.other.*resgrp.counter|resgrp.counter.*resgrp.other"):
        resgrp.next(other)


def test_the_resource_state_persists_between_calls(resgrp):
    c = resgrp.reg.create_resource("resgrp.counter", start=10, step=3)
    assert [resgrp.next(c) for _ in range(3)] == [10, 13, 16]
    d = resgrp.reg.create_resource("resgrp.counter", start=-1)
    assert resgrp.next(counter=d) == -1 and resgrp.next(c) == 19


def test_a_reload_keeps_live_resources_on_their_generation(resgrp):
    old = resgrp.reg.create_resource("resgrp.counter", start=1)
    assert old.generation == 1
    resgrp.place(resgrp.v2)  # v2 adds 1000 to what next() writes
    assert resgrp.reg.reload("resgrp")["generation"] == 2
    new = resgrp.reg.create_resource("resgrp.counter", start=1)
    assert new.generation == 2 and old.generation == 1
    assert resgrp.next(old) == 1  # generation 1's code for generation 1's state
    assert resgrp.next(new) == 1001
    assert [t["generation"] for t in resgrp.reg.resource_types() if t["type"] == "resgrp.counter"] == [2]


def test_two_ranks_in_one_process_and_reset_during_a_call(reg, tmp_path):
    # Two comms over a file store, created at once (each create waits for the other rank).
    comms = [None, None]
    errors = []

    def create(rank):
        try:
            comms[rank] = reg.create_resource(COMM, rank=rank, world_size=2, store=f"file://{tmp_path}",
                                              name="pytest", timeout_s=30)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=create, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    all_reduce = reg.op("communication.all_reduce")
    xs = [np.full(5, 1.5, np.float32), np.full(5, 2.0, np.float32)]

    def rank0():
        try:
            all_reduce(xs[0], comms[0])
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=rank0)
    t.start()  # waits in the store for rank 1, with the GIL released
    time.sleep(0.3)
    with pytest.raises(kreg.Error, match=rf"resource {comms[0].id} \(communication.comm\) is in use by a call running in another thread"):
        comms[0].reset()
    assert comms[0].valid
    all_reduce(xs[1], comms[1])
    t.join(timeout=60)
    assert not t.is_alive() and not errors, errors
    assert np.array_equal(xs[0], np.full(5, 3.5, np.float32)) and np.array_equal(xs[1], xs[0])
    for c in comms:
        c.reset()
        assert not c.valid


# ---- kreg.torch: the torch ops take the resource's id ----


@pytest.fixture(scope="module")
def kt(reg):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    try:
        import kreg.torch as kt
    except ImportError as e:
        pytest.skip(f"kreg.torch is not built: {e}")
    kt.register(reg)
    return kt


def test_torch_schema_takes_an_int_id(kt):
    import torch

    p = kt.plan("communication.all_reduce")
    assert p["schema"] == 'all_reduce(Tensor(a!) x, int comm, str op="sum") -> ()'
    assert p["functional_schema"] == 'all_reduce_functional(Tensor x, int comm, str op="sum") -> Tensor'
    arg = torch.ops.kreg_communication.all_reduce.default._schema.arguments[1]
    assert arg.name == "comm" and str(arg.type) == "int" and arg.default_value is None


def test_torch_ops_with_the_id(reg, kt):
    import torch

    g = torch.Generator().manual_seed(5)
    x, res = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g)
    w = 1 + 0.1 * torch.randn(64, generator=g)
    with reg.create_resource(COMM) as comm:
        y = x.clone()
        torch.ops.kreg_communication.all_reduce(y, comm.id)
        assert torch.equal(y, x)
        assert torch.equal(kt.ops.communication.all_reduce(x, comm=comm.id, op="max"), x)
        out = torch.full((3 * 64,), float("nan"))
        torch.ops.kreg_communication.all_gather(x, out, comm.id)
        assert torch.equal(out, x.flatten())
        got_x, got_res = kt.ops.communication.all_reduce_add_rmsnorm(x, res, w, comm.id, eps=1e-5)
        want_x, want_res = kt.ops.layernorm.fused_add_rmsnorm(x, res, w, eps=1e-5)
        assert torch.equal(got_x, want_x) and torch.equal(got_res, want_res)
    # The kreg.Resource object itself is not an int: torch's own argument error.
    with reg.create_resource(COMM) as comm, pytest.raises(RuntimeError, match=r"int.*comm|comm.*int"):
        torch.ops.kreg_communication.all_reduce(x.clone(), comm)


def test_torch_ops_refuse_bad_ids(reg, kt):
    import torch

    x = torch.ones(4)
    for bad in (0, -1, 10**9):
        with pytest.raises(ValueError, match=rf"communication.all_reduce: attribute 'comm': no resource with id {bad} in this registry"):
            torch.ops.kreg_communication.all_reduce(x, bad)
    comm = reg.create_resource(COMM)
    comm.reset()
    with pytest.raises(RuntimeError, match=rf"resource {comm.id} \(communication.comm\) was destroyed"):
        torch.ops.kreg_communication.all_reduce(x, comm.id)
    with pytest.raises(RuntimeError, match=rf"resource {comm.id} \(communication.comm\) was destroyed"):
        kt.ops.communication.all_reduce(x, comm.id)


def test_torch_ops_refuse_a_resource_of_another_type(kt, resgrp):
    import torch

    kt.register(resgrp.reg)  # its own namespace: kreg_resgrp
    counter = resgrp.reg.create_resource("resgrp.counter", start=7)
    other = resgrp.reg.create_resource("resgrp.other")
    out = torch.zeros(1, dtype=torch.int64)
    torch.ops.kreg_resgrp.next(out, counter.id)
    assert out.item() == 7
    with pytest.raises((RuntimeError, ValueError), match=r"resgrp.other.*resgrp.counter|resgrp.counter.*resgrp.other"):
        torch.ops.kreg_resgrp.next(out, other.id)


def test_torch_compile_carries_the_id_as_an_int(reg, kt):
    import torch

    if kt.TORCH_VERSION < (2, 4):
        pytest.skip(f"torch {torch.__version__}: torch.compile of custom ops needs torch >= 2.4")
    torch._dynamo.reset()
    with reg.create_resource(COMM) as comm:
        def step(x, res, w):
            y = kt.ops.communication.all_reduce(x * 2.0, comm.id)
            return kt.ops.communication.all_reduce_add_rmsnorm(y, res, w, comm.id)

        g = torch.Generator().manual_seed(9)
        x, res, w = torch.randn(2, 32, generator=g), torch.randn(2, 32, generator=g), torch.rand(32, generator=g) + 0.5
        want = step(x, res, w)
        assert torch._dynamo.explain(step)(x, res, w).graph_break_count == 0
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(x, res, w)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    torch._dynamo.reset()
