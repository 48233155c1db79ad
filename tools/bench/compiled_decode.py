#!/usr/bin/env python3
"""kreg ops inside a compiled torch graph at decode shapes, against Inductor's own kernels.

Two steps, each written with kreg ops and as the same math in torch ops (which Inductor
turns into kernels of its own):
  rmsnorm x4:          four dependent rmsnorms (four kernels either way);
  add+norm,silu,norm:  fused_add_rmsnorm -> silu_and_mul -> rmsnorm, a decoder layer's
                       elementwise part (Inductor fuses silu_and_mul into the last norm).
Each is compiled with torch.compile(fullgraph=True) and timed on the device as CUDA-graph
replays (20 steps captured in one graph, so the figure is kernels plus the gaps between
them); also printed, the host's time per call of the compiled function in the default
mode and with mode="reduce-overhead" (torch's own CUDA graphs), where decode sizes are
host-bound. The kernels each step launches are counted with torch.profiler.

    PYTHONPATH=build/python python3 tools/bench/compiled_decode.py
"""

import argparse
import os
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build" / "python"))

import torch  # noqa: E402

import kreg  # noqa: E402
import kreg.torch as kt  # noqa: E402

EPS = 1e-6


def torch_rmsnorm(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def torch_layer(x, res, w, w2):
    s = x.float() + res.float()
    r = s.to(x.dtype)
    y = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)
    d = y.shape[-1] // 2
    z = (torch.nn.functional.silu(y[:, :d].float()) * y[:, d:].float()).to(x.dtype)
    return torch_rmsnorm(z, w2), r


def kreg_layer(x, res, w, w2):
    y, r = kt.ops.layernorm.fused_add_rmsnorm(x, res, w, eps=EPS)
    z = kt.ops.activation.silu_and_mul(y)
    return kt.ops.layernorm.rmsnorm(z, w2, eps=EPS), r


# Kernel for kernel: four dependent row reductions, which Inductor cannot fuse into fewer
# kernels either (the profiler's counts below say so).
def torch_chain(x, res, w, w2):
    for _ in range(4):
        x = torch_rmsnorm(x, w)
    return x, res


def kreg_chain(x, res, w, w2):
    for _ in range(4):
        x = kt.ops.layernorm.rmsnorm(x, w, eps=EPS)
    return x, res


# The same layer with the residual add in place on the step's inputs, the way an engine
# calls it (torch.ops.kreg_layernorm.fused_add_rmsnorm: x and res are written). Under
# torch.compile functionalization turns it into a functional op and Inductor writes the
# results back into x and res: no copies, unlike the functional form above, which must
# leave its inputs alone.
def kreg_layer_inplace(x, res, w, w2):
    torch.ops.kreg_layernorm.fused_add_rmsnorm(x, res, w, eps=EPS)
    z = kt.ops.activation.silu_and_mul(x)
    return kt.ops.layernorm.rmsnorm(z, w2, eps=EPS), res


def torch_layer_inplace(x, res, w, w2):
    o, r = torch_layer(x, res, w, w2)
    y = torch_rmsnorm(r, w)  # what the in-place op leaves in x
    x.copy_(y)
    res.copy_(r)
    return o, res


STEPS = {
    "rmsnorm x4": (kreg_chain, torch_chain),
    "add+norm,silu,norm": (kreg_layer, torch_layer),
    "same, in place": (kreg_layer_inplace, torch_layer_inplace),
}


def event_us(call, reps, rounds, per=1):
    """Median over `rounds` of CUDA-event time around `reps` back-to-back call()s, in us
    per call / per (each call doing `per` steps)."""
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / (reps * per))
    return statistics.median(times)


def time_us(fn, args, reps, rounds):
    """Per call, as the caller sees it: back-to-back calls (the host's time when it is the
    bottleneck, as at decode sizes)."""
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    return event_us(lambda: fn(*args), reps, rounds)


def graph_us(fn, args, unroll, reps, rounds):
    """Per step on the device: `unroll` steps captured into one CUDA graph, replayed `reps`
    times (the device is the bottleneck: kernels and the gaps between them, no host
    launch cost)."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(unroll):
            fn(*args)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    return event_us(graph.replay, reps, rounds, per=unroll)


def kernel_count(fn, args):
    from torch.profiler import ProfilerActivity, profile

    fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len([n for n in names if "memcpy" not in n.lower() and "memset" not in n.lower()])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=os.environ.get("KREG_MANIFEST", str(ROOT / "registry.yaml")))
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--tokens", default="1,16,64")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pdl", action="store_true", help="kreg.set_pdl(True) for the kreg steps")
    args = parser.parse_args()
    kreg.set_pdl(args.pdl)
    if not torch.cuda.is_available():
        sys.exit("compiled_decode: needs a CUDA device")
    reg = kreg.open(args.manifest)
    kt.register(reg)
    h = args.hidden
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, H={h} bf16, median of {args.rounds} rounds, "
          f"kreg PDL {'on' if args.pdl else 'off'}")
    print("graph: us per step on the device, 20 steps of the torch.compile(fullgraph=True)'d function captured in one CUDA graph")
    print("host: us per call of the compiled function (default mode / mode=reduce-overhead), back to back")
    print("kern: kernels per step (torch.profiler, copies not counted); /k: graph us per kernel; ratio: inductor / kreg of the graph figure")
    print(f"{'step':<20} {'T':>4} | {'kreg graph':>10} {'host':>7} {'r-o':>7} {'kern':>4} {'/k':>5} | "
          f"{'ind. graph':>10} {'host':>7} {'r-o':>7} {'kern':>4} {'/k':>5} | {'ratio':>5}")
    for label, (kstep, tstep) in STEPS.items():
        for t in [int(v) for v in args.tokens.split(",")]:
            g = torch.Generator(device="cuda").manual_seed(t)
            x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
            res = torch.randn(t, h, device="cuda", generator=g).bfloat16()
            w = (1 + 0.1 * torch.randn(h, device="cuda", generator=g)).bfloat16()
            w2 = (1 + 0.1 * torch.randn(h // 2, device="cuda", generator=g)).bfloat16()
            inputs = (x, res, w, w2)
            row = {}
            for name, step in (("kreg", kstep), ("inductor", tstep)):
                mine = tuple(v.clone() for v in inputs)  # the in-place steps write x and res
                torch._dynamo.reset()
                c = torch.compile(step, fullgraph=True)
                row[name] = dict(out=[o.clone() for o in c(*mine)],
                                 graph=graph_us(c, mine, 20, args.reps // 10, args.rounds),
                                 host=time_us(c, mine, args.reps, args.rounds),
                                 kernels=kernel_count(c, mine))
                torch._dynamo.reset()
                ro = torch.compile(step, fullgraph=True, mode="reduce-overhead")
                row[name]["ro"] = time_us(ro, mine, args.reps, args.rounds)
            for a, b in zip(row["kreg"]["out"], row["inductor"]["out"]):
                torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)
            k, i = row["kreg"], row["inductor"]
            pk = k["graph"] / max(k["kernels"], 1)
            pi = i["graph"] / max(i["kernels"], 1)
            print(f"{label:<20} {t:>4} | {k['graph']:>10.2f} {k['host']:>7.1f} {k['ro']:>7.1f} {k['kernels']:>4} {pk:>5.2f} | "
                  f"{i['graph']:>10.2f} {i['host']:>7.1f} {i['ro']:>7.1f} {i['kernels']:>4} {pi:>5.2f} | {i['graph'] / k['graph']:>5.2f}")


if __name__ == "__main__":
    main()
