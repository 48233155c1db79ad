#!/usr/bin/env python3
"""PyTorch baselines for the layernorm and activation groups.

Times torch eager and torch.compile of the exact math each kreg op computes (fp32
upcast, one rounding at the store; docs/kernels.md), in bf16, and a device-to-device
copy as the bandwidth ceiling. Bytes are the fewest a kernel must move: each input read
once, each output written once.

Large shapes rotate over enough input sets to exceed L2 (the H200 has 60 MB) and take
the median of per-call CUDA-event timings; 16-token shapes replay a CUDA graph of many
calls, which hides launch gaps, and report the time per call.

    python3 tools/bench/torch_baseline.py --csv torch_baseline.csv
"""

import argparse
import csv
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

EPS = 1e-6
DTYPE = torch.bfloat16
NORM_SHAPES = [(16, 4096), (32768, 4096)]  # (T, H)
ACT_SHAPES = [(16, 28672), (32768, 28672)]  # (T, 2D)
MIN_ROTATION_BYTES = 256 << 20  # > 4x the H200's L2
MIN_SETS = 4
GRAPH_CALLS = 64  # calls per captured graph for the small shapes


# ---- The math, exactly as the kreg ops define it ----


def rmsnorm(x, w):
    xf = x.float()
    scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * scale * w.float()).to(x.dtype)


def gemma_rmsnorm(x, w):
    xf = x.float()
    scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * scale * (1.0 + w.float())).to(x.dtype)


def fused_add_rmsnorm(x, residual, w):
    # kreg updates x and residual in place; the functional form moves the same bytes
    # (two reads, two writes) without the extra copy an in-place epilogue costs eager.
    s = x.float() + residual.float()
    scale = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS)
    return (s * scale * w.float()).to(x.dtype), s.to(x.dtype)


def _gated(act):
    def fn(x):
        d = x.shape[-1] // 2
        xf = x.float()
        return (act(xf[..., :d]) * xf[..., d:]).to(x.dtype)

    return fn


silu_and_mul = _gated(F.silu)
gelu_and_mul = _gated(lambda a: F.gelu(a, approximate="none"))
gelu_tanh_and_mul = _gated(lambda a: F.gelu(a, approximate="tanh"))


def norm_case(name, fn, fused):
    def make_inputs(t, h, gen):
        x = torch.randn(t, h, dtype=DTYPE, device="cuda", generator=gen)
        w = (1.0 + 0.1 * torch.randn(h, device="cuda", generator=gen)).to(DTYPE)
        if fused:
            r = torch.randn(t, h, dtype=DTYPE, device="cuda", generator=gen)
            return (x, r, w)
        return (x, w)

    def nbytes(t, h):
        elem = torch.finfo(DTYPE).bits // 8
        return elem * (t * h * (4 if fused else 2) + h)

    return dict(name=name, fn=fn, make_inputs=make_inputs, nbytes=nbytes, shapes=NORM_SHAPES)


def act_case(name, fn):
    def make_inputs(t, width, gen):
        return (torch.randn(t, width, dtype=DTYPE, device="cuda", generator=gen),)

    def nbytes(t, width):
        elem = torch.finfo(DTYPE).bits // 8
        return elem * (t * width + t * width // 2)

    return dict(name=name, fn=fn, make_inputs=make_inputs, nbytes=nbytes, shapes=ACT_SHAPES)


CASES = [
    norm_case("rmsnorm", rmsnorm, fused=False),
    norm_case("fused_add_rmsnorm", fused_add_rmsnorm, fused=True),
    norm_case("gemma_rmsnorm", gemma_rmsnorm, fused=False),
    act_case("silu_and_mul", silu_and_mul),
    act_case("gelu_and_mul", gelu_and_mul),
    act_case("gelu_tanh_and_mul", gelu_tanh_and_mul),
]


# ---- Timing ----


def time_per_call(fn, input_sets, reps):
    """Median over `reps` single calls, each timed with its own pair of CUDA events."""
    for i in range(3):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        args = input_sets[i % len(input_sets)]
        starts[i].record()
        fn(*args)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def time_graph(fn, input_sets, reps):
    """Median time per call over `reps` replays of a graph of GRAPH_CALLS calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(*input_sets[i % len(input_sets)])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(GRAPH_CALLS):
            fn(*input_sets[i % len(input_sets)])
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / GRAPH_CALLS)
    return statistics.median(times)


def copy_bandwidth(reps):
    """Device-to-device copy of a 2 GiB buffer, counting bytes read plus bytes written."""
    n = 2 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    src.random_(0, 256)
    dst = torch.empty_like(src)
    us = time_per_call(lambda: dst.copy_(src), [()], reps)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (us * 1e-6) / 1e9


def check_close(name, got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        diff = (g.float() - w.float()).abs().max().item()
        scale = w.float().abs().max().item()
        # bf16 results of the same fp32 math may differ by one rounding step.
        if not math.isfinite(diff) or diff > 2 ** -6 * max(scale, 1.0):
            sys.exit(f"{name}: compiled result differs from eager by {diff}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", required=True, help="where to write the results")
    parser.add_argument("--reps", type=int, default=60, help="timed calls per measurement")
    parser.add_argument(
        "--compile-mode",
        default="max-autotune-no-cudagraphs",
        help="torch.compile mode ('default' is faster to compile)",
    )
    parser.add_argument("--only", default="", help="comma-separated op names to run")
    args = parser.parse_args()
    if args.reps < 50:
        parser.error("--reps must be at least 50")

    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    t0 = time.time()
    copy_gbps = copy_bandwidth(args.reps)
    print(f"device-to-device copy: {copy_gbps:.0f} GB/s ({torch.cuda.get_device_name()})")

    only = set(filter(None, args.only.split(",")))
    rows = []
    for case in CASES:
        if only and case["name"] not in only:
            continue
        compiled = torch.compile(case["fn"], mode=args.compile_mode, dynamic=False)
        for t, width in case["shapes"]:
            nbytes = case["nbytes"](t, width)
            small = t <= 64
            input_sets = [case["make_inputs"](t, width, gen)]
            if not small:
                set_bytes = sum(a.numel() * a.element_size() for a in input_sets[0])
                sets = max(MIN_SETS, math.ceil(MIN_ROTATION_BYTES / set_bytes))
            else:
                sets = MIN_SETS
            input_sets += [case["make_inputs"](t, width, gen) for _ in range(sets - 1)]
            check_close(case["name"], compiled(*input_sets[0]), case["fn"](*input_sets[0]))
            for impl, fn in (("eager", case["fn"]), ("compile", compiled)):
                us = (time_graph if small else time_per_call)(fn, input_sets, args.reps)
                gbps = nbytes / (us * 1e-6) / 1e9
                rows.append(
                    dict(
                        op=case["name"],
                        T=t,
                        width=width,
                        dtype="bf16",
                        impl=impl,
                        timing="graph" if small else "events",
                        median_us=round(us, 3),
                        gbps=round(gbps, 1),
                        pct_copy=round(100 * gbps / copy_gbps, 1),
                    )
                )
            del input_sets
            torch.cuda.empty_cache()

    header = f"{'op':<20}{'T':>7}{'width':>7} {'impl':<8}{'timing':<7}{'us':>10}{'GB/s':>9}{'%copy':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['op']:<20}{r['T']:>7}{r['width']:>7} {r['impl']:<8}{r['timing']:<7}"
            f"{r['median_us']:>10.2f}{r['gbps']:>9.0f}{r['pct_copy']:>7.1f}"
        )
    rows.append(
        dict(op="copy", T=0, width=0, dtype="u8", impl="copy_", timing="events", median_us=0,
             gbps=round(copy_gbps, 1), pct_copy=100.0)
    )
    with open(args.csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.csv} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
