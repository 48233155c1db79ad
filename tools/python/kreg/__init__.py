"""kreg: the kernel registry from Python.

    import kreg
    reg = kreg.open("registry.yaml")
    reg.ops.layernorm.rmsnorm(x, w, out, eps=1e-6)     # or: rms = reg.op("layernorm.rmsnorm")

Tensors are any objects with ``__dlpack__`` (torch, numpy, cupy, jax), passed without a
copy; CUDA calls run on torch's current stream (when torch is imported) or on
``stream=``. See docs/python.md.
"""

import functools

import sys

from . import _kreg
from ._kreg import Error, InvalidArgument, NotFound, Op, Registry, Resource, open, pdl  # noqa: F401

__all__ = [
    "open", "Registry", "Op", "Resource", "Error", "InvalidArgument", "NotFound", "set_pdl", "pdl",
]


def _flag(value, name):
    """True or False (numpy's bool_, 0 and 1 too); anything else is a TypeError, so that a
    string such as "no" or a stray number does not turn a flag on."""
    if value is True or value is False:
        return value
    if type(value).__name__ == "bool_" or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise TypeError(f"kreg.set_pdl: {name} must be True or False, not {value!r:.60}")


def set_pdl(enabled, stable_inputs=False):
    """Programmatic dependent launch (sm90+) for every CUDA call of this process, from
    kreg.Op and from kreg.torch's torch ops: a kernel that honours it may start while the
    kernel before it on the stream finishes (it waits before reading that kernel's
    output), which hides launch latency at decode sizes. Off by default.

    stable_inputs=True (with enabled=True) also vouches that each op's stable inputs
    (docs/kernels.md: weights, tables, sequence lengths, a cache's older rows) were
    written before the previous kernel on the stream started, so kernels may read them
    before waiting for it (rmsnorm prefetches its weight). Asking for stable inputs
    without PDL raises ValueError."""
    _kreg.set_pdl(_flag(enabled, "enabled"), _flag(stable_inputs, "stable_inputs"))
    kt = sys.modules.get("kreg.torch")
    if kt is not None:
        kt._native.set_launch_flags(_kreg.launch_flags())


class _Group:
    """``reg.ops.<group>``: each op of the group as an attribute (a cached kreg.Op)."""

    def __init__(self, registry, name):
        self._registry = registry
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            op = self._registry.op(f"{self._name}.{name}")
        except NotFound:
            shown = _kreg._excerpt(f"{self._name}.{name}")
            raise AttributeError(f"kreg: no op '{shown}'") from None
        setattr(self, name, op)  # later lookups hit the instance dict
        return op

    def __dir__(self):
        prefix = self._name + "."
        return [op[len(prefix):] for op in self._registry.list() if op.startswith(prefix)]

    def __repr__(self):
        return f"<kreg ops of group {self._name}>"


class _Ops:
    """``reg.ops``: each group as an attribute."""

    def __init__(self, registry):
        self._registry = registry

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if not any(g["name"] == name for g in self._registry.groups()):
            raise AttributeError(f"kreg: no group '{_kreg._excerpt(name)}'")
        group = _Group(self._registry, name)
        setattr(self, name, group)
        return group

    def __dir__(self):
        return [g["name"] for g in self._registry.groups()]


Registry.ops = functools.cached_property(_Ops)
Registry.ops.__set_name__(Registry, "ops")
Registry.ops.__doc__ = "Attribute access to ops: reg.ops.layernorm.rmsnorm(...)."
