#!/usr/bin/env python3
"""Host time of one kreg call from Python, next to a plain torch op call.

Times tiny ops (1 token x 128) so that the kernel is negligible and the figure is the
Python call path: argument parsing, DLPack export of each tensor, the stream query,
the core's checks and the launch. The launch alone (and the C++ call path without
Python) is measured by build/tests/bench/kreg-bench-launch. Calls run in chunks of --chunk with no synchronisation
inside a chunk (the device queue never fills), the device is synchronised between chunks
outside the timed region, and the median time per call over chunks is reported.

    PYTHONPATH=build/python python3 tools/bench/py_overhead.py            # CUDA torch tensors
    PYTHONPATH=build/python python3 tools/bench/py_overhead.py --device cpu   # NumPy/torch CPU

Without torch (or with --device cpu and no torch) the kreg calls use NumPy arrays on the
CPU, and the CPU reference kernels' time is included.
"""

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build" / "python"))

import kreg  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def per_call_us(fn, calls, chunk, sync):
    """Median host microseconds per call of fn() over chunks of `chunk` calls."""
    for _ in range(min(chunk, 100)):
        fn()
    sync()
    times = []
    done = 0
    while done < calls:
        n = min(chunk, calls - done)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        t1 = time.perf_counter_ns()
        sync()
        times.append((t1 - t0) / n / 1e3)
        done += n
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=os.environ.get("KREG_MANIFEST", str(ROOT / "registry.yaml")))
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="default: cuda when torch sees a GPU, else cpu")
    parser.add_argument("--calls", type=int, default=200_000, help="timed calls per measurement")
    parser.add_argument("--chunk", type=int, default=200, help="calls between synchronisations")
    parser.add_argument("--width", type=int, default=128, help="hidden size (tokens: 1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all rows (median)")
    parser.add_argument("--pair-rounds", type=int, default=15, help="alternating rounds per side-by-side pair")
    parser.add_argument("--core", type=int, default=None,
                        help="pin the process to this CPU core (default: the first it may use)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        core = args.core if args.core is not None else min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        print(f"pinned to core {core}")

    have_cuda = torch is not None and torch.cuda.is_available()
    device = args.device or ("cuda" if have_cuda else "cpu")
    if device == "cuda" and not have_cuda:
        sys.exit("py_overhead: --device cuda needs torch with a CUDA device")

    reg = kreg.open(args.manifest)
    rmsnorm = reg.op("layernorm.rmsnorm")
    silu = reg.op("activation.silu_and_mul")
    h = args.width
    rows = []
    pairs = []  # (label, direct kreg call, the torch.ops call)

    if torch is not None:
        dt = torch.bfloat16 if device == "cuda" else torch.float32
        x = torch.randn(1, h, dtype=dt, device=device)
        w = torch.ones(h, dtype=dt, device=device)
        out = torch.empty_like(x)
        x2 = torch.randn(1, 2 * h, dtype=dt, device=device)
        out2 = torch.empty(1, h, dtype=dt, device=device)
        a, b, c = torch.randn(1, h, dtype=dt, device=device), torch.randn(1, h, dtype=dt, device=device), torch.empty(1, h, dtype=dt, device=device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        kind = f"torch {device} {str(dt).replace('torch.', '')}"
        rows.append((f"kreg layernorm.rmsnorm(x, w, out)      1x{h}", lambda: rmsnorm(x, w, out)))
        rows.append((f"kreg layernorm.rmsnorm(..., eps=1e-6)  1x{h}", lambda: rmsnorm(x, w, out, eps=1e-6)))
        rows.append((f"kreg activation.silu_and_mul(x, out)   1x{h}", lambda: silu(x2, out2)))
        rows.append((f"kreg reg.ops.layernorm.rmsnorm(...)    1x{h}", lambda: reg.ops.layernorm.rmsnorm(x, w, out)))
        try:
            import kreg.torch as kt
        except ImportError as e:
            kt = None
            print(f"kreg.torch not available ({e}): no torch.ops rows")
        if kt is not None:
            kt.register(reg)
            t_rms = torch.ops.kreg_layernorm.rmsnorm.default
            t_silu = torch.ops.kreg_activation.silu_and_mul.default
            rows.append((f"torch.ops.kreg_layernorm.rmsnorm.default(x, w, out) 1x{h}", lambda: t_rms(x, w, out)))
            rows.append((f"torch.ops.kreg_layernorm.rmsnorm(x, w, out)         1x{h}",
                         lambda: torch.ops.kreg_layernorm.rmsnorm(x, w, out)))
            rows.append((f"torch.ops.kreg_activation.silu_and_mul.default(x, out) 1x{h}", lambda: t_silu(x2, out2)))
            f_rms = kt.ops.layernorm.rmsnorm
            rows.append((f"kreg.torch.ops.layernorm.rmsnorm(x, w) (allocates)  1x{h}", lambda: f_rms(x, w)))
            pairs.append(("kreg rmsnorm(x, w, out) vs torch.ops.kreg_layernorm.rmsnorm.default",
                          lambda: rmsnorm(x, w, out), lambda: t_rms(x, w, out)))
            pairs.append(("kreg silu_and_mul(x, out) vs torch.ops.kreg_activation.silu_and_mul.default",
                          lambda: silu(x2, out2), lambda: t_silu(x2, out2)))
            pairs.append(("torch.add(a, b, out=c) vs torch.ops.aten.add.out (torch's own torch.ops cost)",
                          lambda: torch.add(a, b, out=c), lambda: torch.ops.aten.add.out(a, b, out=c)))
            if hasattr(torch.library, "custom_op"):
                # The obvious wrapper: a Python custom op whose body is the kreg call.
                @torch.library.custom_op("kreg_bench::rmsnorm", mutates_args=("out",))
                def py_rms(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
                    rmsnorm(x, w, out)

                rows.append((f"python custom_op(kreg call) (the obvious wrapper) 1x{h}", lambda: py_rms(x, w, out)))
        rows.append((f"torch.add(a, b, out=c)                 1x{h}", lambda: torch.add(a, b, out=c)))
        rows.append((f"torch.ops.aten.add.out(a, b, out=c)    1x{h}", lambda: torch.ops.aten.add.out(a, b, out=c)))
        rows.append((f"torch.nn.functional.silu(a)            1x{h}", lambda: torch.nn.functional.silu(a)))
        # The pieces of the kreg path, for reading the figures above.
        rows.append(("  piece: x.__dlpack__() (torch's Python exporter)", lambda: x.__dlpack__()))
        rows.append(("  piece: torch._C._to_dlpack(x) (kreg without the C API)", lambda: torch._C._to_dlpack(x)))
        if device == "cuda":
            raw = torch._C._cuda_getCurrentRawStream
            rows.append(("  piece: torch._C._cuda_getCurrentRawStream(0)", lambda: raw(0)))
            rows.append(("  piece: torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream))
    else:
        import numpy as np

        kind = "numpy cpu f32"
        x = np.random.randn(1, h).astype(np.float32)
        w = np.ones(h, np.float32)
        out = np.empty_like(x)
        x2 = np.random.randn(1, 2 * h).astype(np.float32)
        out2 = np.empty((1, h), np.float32)
        a, b, c = x.copy(), x.copy(), np.empty_like(x)
        sync = lambda: None  # noqa: E731
        rows.append((f"kreg layernorm.rmsnorm(x, w, out)      1x{h}", lambda: rmsnorm(x, w, out)))
        rows.append((f"kreg activation.silu_and_mul(x, out)   1x{h}", lambda: silu(x2, out2)))
        rows.append((f"numpy.add(a, b, out=c)                 1x{h}", lambda: np.add(a, b, out=c)))
        rows.append(("  piece: x.__dlpack__()", lambda: x.__dlpack__()))
        rows.append(("  piece: x.__dlpack_device__()", lambda: x.__dlpack_device__()))

    rows.append(("  piece: an empty Python lambda call", lambda: None))
    print(f"Python call overhead, {kind}, {args.calls} calls, median over chunks of {args.chunk} "
          f"(python {sys.version.split()[0]}{', torch ' + torch.__version__ if torch else ''})")
    if device == "cuda":
        print(f"device: {torch.cuda.get_device_name()}")
    if torch is not None:
        # kreg views torch tensors through it when present (docs/python.md), else through
        # torch._C._to_dlpack capsules.
        have = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
        print(f"torch DLPack C exchange API: {'yes' if have else 'no (capsule path)'}")
    # Three rounds over every row, so that a slow moment of the machine hits all rows
    # rather than one: the median of the three per row.
    results = {label: [] for label, _ in rows}
    for _ in range(args.rounds):
        for label, fn in rows:
            results[label].append(per_call_us(fn, args.calls, args.chunk, sync))
    for label, _ in rows:
        r = results[label]
        print(f"{label:<58} {statistics.median(r):8.3f} us/call  (rounds: {' '.join(f'{v:.2f}' for v in r)})")
    print(f"resolved: rmsnorm -> {rmsnorm.resolved_backend}, silu_and_mul -> {silu.resolved_backend}")
    if pairs:
        # Side by side: the two calls of a pair alternate in short rounds, so that the
        # machine's slow and fast moments hit both; the median of the per-round differences.
        n = max(args.calls // 10, 1000)
        print(f"side by side ({args.pair_rounds} alternating rounds of {n} calls each):")
        for label, fa, fb in pairs:
            ta, tb = [], []
            for _ in range(args.pair_rounds):
                ta.append(per_call_us(fa, n, args.chunk, sync))
                tb.append(per_call_us(fb, n, args.chunk, sync))
            d = statistics.median(b - a for a, b in zip(ta, tb))
            print(f"  {label:<62} {statistics.median(ta):7.3f} -> {statistics.median(tb):7.3f} us/call, "
                  f"difference {d:+.3f} us (median of per-round differences)")


if __name__ == "__main__":
    main()
