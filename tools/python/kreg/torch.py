"""kreg.torch: every kreg op as a torch.library custom op (docs/python.md).

    import kreg, kreg.torch
    reg = kreg.open("registry.yaml")
    kreg.torch.register(reg)

    torch.ops.kreg_layernorm.rmsnorm(x, w, out, eps=1e-6)        # kreg's signature: writes out
    out = kreg.torch.ops.layernorm.rmsnorm(x, w, eps=1e-6)        # allocates and returns out
    # = torch.ops.kreg_layernorm.rmsnorm_functional(x, w, eps=1e-6)

Each op of group G is defined in the namespace ``kreg_G`` twice: under its own name with
kreg's signature (tensors it writes are ``Tensor(a!)``, it returns nothing), and, where
the inputs determine every output's shape and dtype, as ``<name>_functional``, which
allocates the outputs (and copies the tensors the op updates in place) and returns them.
Both run the kreg kernel from C++ (kreg._torch) on torch's current stream, with
workspaces from torch's caching allocator, and both have a fake implementation, so they
trace under FakeTensor, functionalization, torch.compile(fullgraph=True) and CUDA graphs.

torch's op namespaces are process-wide, so one registry backs the torch ops of a group
in a process (registering a group from a second registry is an error);
``reg.reload(group)`` swaps the code behind the same torch ops (no re-registration, no
recompilation) and registers the ops the new library adds.
"""

import re

import torch

from . import _kreg

try:
    from . import _torch as _native
except ImportError as e:  # built without torch, or for another torch
    raise ImportError(
        f"kreg.torch: the kreg._torch extension is missing or does not load ({e}); it is built "
        f"by CMake when the Python it is built for has torch and its C++ headers "
        f"(Debian: apt install python3-torch libtorch-dev); this is torch {torch.__version__}"
    ) from None

__all__ = ["register", "ops", "registered", "plan", "TORCH_VERSION"]


def _version(text):
    nums = re.findall(r"\d+", text)
    return tuple(int(n) for n in nums[:2]) if len(nums) >= 2 else (0, 0)


TORCH_VERSION = _version(torch.__version__)
_native.set_launch_flags(_kreg.launch_flags())  # kreg.set_pdl before this import
if _version(_native.torch_version) != TORCH_VERSION:
    raise ImportError(
        f"kreg.torch: kreg._torch was built against torch {_native.torch_version}, this is "
        f"torch {torch.__version__}: rebuild kreg with this Python"
    )

_DTYPES = {
    "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
    "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
    "u8": torch.uint8, "bool": torch.bool,
}
for _name, _attr in (("f8e4m3", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2")):
    if hasattr(torch, _attr):
        _DTYPES[_name] = getattr(torch, _attr)

_libraries = {}  # namespace -> torch.library.Library: definitions live as long as the process
_plans = {}  # kreg op id -> plan (kreg._torch.plan) of every registered op
_owners = {}  # namespace -> the registry whose ops it holds


def registered():
    """The kreg op ids registered as torch ops, sorted."""
    return sorted(_plans)


def plan(op):
    """The torch side of a registered op: namespace, names, both schemas, and, for an op
    without a functional form, the reason."""
    try:
        return dict(_plans[op])
    except KeyError:
        raise LookupError(f"kreg.torch: '{op}' is not registered (kreg.torch.register(reg))") from None


def _library(ns):
    lib = _libraries.get(ns)
    if lib is None:
        try:
            lib = torch.library.Library(ns, "FRAGMENT")
        except ValueError:  # torch < 2.0: one DEF library per namespace, kept here
            lib = torch.library.Library(ns, "DEF")
        _libraries[ns] = lib
    return lib


def _define(lib, schema, tags):
    if tags and TORCH_VERSION >= (2, 1):
        lib.define(schema, tags=tags)
    else:
        lib.define(schema)


def _graph_unsafe_tags(reg, op):
    """cudagraph_unsafe for an op with a device implementation (cuda, jit, nccl: every
    backend but cpu) that is not graph-safe, so that torch.compile's CUDA graphs leave it
    out rather than capture it."""
    tag = getattr(getattr(torch, "Tag", None), "cudagraph_unsafe", None)
    if tag is None:
        return ()
    impls = reg.info(op)["implementations"]
    cuda = [i for i in impls if i["backend"] != "cpu"]
    return (tag,) if any(not i["graph_safe"] for i in cuda) else ()


def _fake_mutating(*args, **kwargs):
    return None


def _make_fake_functional(p):
    """The functional form's fake: the results' shapes from the inputs' named dimensions
    (the recipe kreg._torch follows for the real results), symbolic sizes included."""
    names = p["inputs"]
    results = p["results"]

    def fake(*args, **kwargs):
        def arg(k):
            return args[k] if k < len(args) else kwargs[names[k]]

        first = next(arg(k) for k in range(len(names)) if isinstance(arg(k), torch.Tensor))
        outs = []
        for r in results:
            if r["clone_of"] >= 0:
                outs.append(torch.empty_like(arg(r["clone_of"]), memory_format=torch.contiguous_format))
                continue
            shape = []
            for literal, inp, axis, divisor, coef in r["dims"]:
                shape.append(literal if literal >= 0 else arg(inp).shape[axis] // divisor * coef)
            dtype = arg(r["dtype_input"]).dtype if r["dtype_input"] >= 0 else _DTYPES[r["dtype"]]
            outs.append(first.new_empty(shape, dtype=dtype))
        return outs[0] if len(outs) == 1 else tuple(outs)

    fake.__name__ = p["functional_name"] + "_fake"
    return fake


def _register_fake(lib, ns, name, fn):
    qualname = f"{ns}::{name}"
    if hasattr(torch.library, "register_fake"):  # torch >= 2.4
        torch.library.register_fake(qualname, fn, lib=lib)
    elif hasattr(torch.library, "impl_abstract"):  # torch 2.1 - 2.3
        torch.library.impl_abstract(qualname, fn, lib=lib)
    else:  # torch < 2.1: a Meta kernel (meta tensors; no FakeTensor API)
        meta = _libraries.get((ns, "Meta"))
        if meta is None:
            meta = _libraries[(ns, "Meta")] = torch.library.Library(ns, "IMPL", "Meta")
        meta.impl(name, fn)


def register(reg):
    """Registers every op of `reg` not registered yet as torch ops (module docstring);
    returns the op ids it added. Calling it again after a reload adds the new ops."""
    if not isinstance(reg, _kreg.Registry):
        raise TypeError(f"kreg.torch.register() takes a kreg.Registry, not {type(reg).__name__}")
    capsule = reg._capsule()
    ops = reg.list()
    # torch's op namespaces are process-wide: a group's namespace belongs to the first
    # registry that registers it, and no other may take it over.
    for op in ops:
        ns = "kreg_" + op.split(".", 1)[0]
        owner = _owners.get(ns)
        if owner is not None and owner is not reg:
            raise RuntimeError(
                f"kreg.torch: torch.ops.{ns} is already backed by {owner!r}; torch's op "
                f"namespaces are process-wide, so {reg!r} cannot register group "
                f"'{op.split('.', 1)[0]}' too"
            )
    new = [op for op in ops if op not in _plans]
    plans = [_native.plan(capsule, op) for op in new]
    for p in plans:
        lib = _library(p["ns"])
        tags = _graph_unsafe_tags(reg, p["op"])
        _define(lib, p["schema"], tags)
        if p["functional_schema"]:
            _define(lib, p["functional_schema"], tags)
    _native.install(capsule, reg, new)
    for p in plans:
        lib = _library(p["ns"])
        _register_fake(lib, p["ns"], p["name"], _fake_mutating)
        if p["functional_schema"]:
            _register_fake(lib, p["ns"], p["functional_name"], _make_fake_functional(p))
        _plans[p["op"]] = p
        _owners[p["ns"]] = reg
    return new


class _Group:
    """``kreg.torch.ops.<group>``: each op's functional form (a torch OpOverload)."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        op = f"{self._name}.{name}"
        p = _plans.get(op)
        if p is None:
            raise AttributeError(f"kreg.torch: no registered op '{op}' (kreg.torch.register(reg))")
        if not p["functional_schema"]:
            raise AttributeError(
                f"kreg.torch: '{op}' has no functional form: {p['reason']}; call "
                f"torch.ops.{p['ns']}.{p['name']} with the output tensors"
            )
        overload = getattr(getattr(torch.ops, p["ns"]), p["functional_name"]).default
        setattr(self, name, overload)
        return overload

    def __dir__(self):
        prefix = self._name + "."
        return [op[len(prefix):] for op, p in _plans.items() if op.startswith(prefix) and p["functional_schema"]]


class _Ops:
    """``kreg.torch.ops``: the registered groups."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if not any(op.startswith(name + ".") for op in _plans):
            raise AttributeError(f"kreg.torch: no registered group '{name}' (kreg.torch.register(reg))")
        group = _Group(name)
        setattr(self, name, group)
        return group

    def __dir__(self):
        return sorted({op.split(".", 1)[0] for op in _plans})


ops = _Ops()

# A reload of the registry behind the torch ops registers the ops its new library adds;
# the existing ones already run the new code (their kernels hold kreg handles).
_reload = _kreg.Registry.reload


def _reload_and_register(self, group, precheck=False):
    report = _reload(self, group, precheck=precheck)
    ns = "kreg_" + report["group"]
    if _owners.get(ns) is self and report["added_ops"]:
        register(self)
    return report


_reload_and_register.__doc__ = _reload.__doc__
_kreg.Registry.reload = _reload_and_register
