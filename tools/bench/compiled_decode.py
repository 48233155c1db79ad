#!/usr/bin/env python3
"""kreg ops inside a compiled torch graph at decode shapes, against Inductor's own kernels.

Two steps, each written with kreg ops and as the same math in torch ops (which Inductor
turns into kernels of its own):
  rmsnorm x4:          four dependent rmsnorms (four kernels either way);
  add+norm,silu,norm:  fused_add_rmsnorm -> silu_and_mul -> rmsnorm, a decoder layer's
                       elementwise part (Inductor fuses silu_and_mul into the last norm).
Both are compiled with torch.compile(fullgraph=True, mode="reduce-overhead") (CUDA graphs)
and timed as graph replays: CUDA events around --reps back-to-back calls, median of
--rounds. The kernels each step launches are counted with torch.profiler (without CUDA graphs). Also printed:
the same steps without CUDA graphs (default mode), where the host's launch path shows.

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


STEPS = {
    "rmsnorm x4": (kreg_chain, torch_chain),
    "add+norm,silu,norm": (kreg_layer, torch_layer),
}


def time_us(fn, args, reps, rounds):
    for _ in range(5):
        fn(*args)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


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
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compiled_decode: needs a CUDA device")
    reg = kreg.open(args.manifest)
    kt.register(reg)
    h = args.hidden
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, H={h} bf16; "
          f"us per step (median of {args.rounds}x{args.reps}); kernels per step (torch.profiler, "
          f"without CUDA graphs); ratio = inductor / kreg")
    print(f"{'step':<20} {'T':>4} {'mode':<16} {'kreg us':>9} {'kernels':>8} {'inductor us':>12} {'kernels':>8} {'ratio':>6}")
    for label, (kstep, tstep) in STEPS.items():
        for t in [int(v) for v in args.tokens.split(",")]:
            g = torch.Generator(device="cuda").manual_seed(t)
            x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
            res = torch.randn(t, h, device="cuda", generator=g).bfloat16()
            w = (1 + 0.1 * torch.randn(h, device="cuda", generator=g)).bfloat16()
            w2 = (1 + 0.1 * torch.randn(h // 2, device="cuda", generator=g)).bfloat16()
            inputs = (x, res, w, w2)
            counts = ("-", "-")
            for mode in ("default", "reduce-overhead"):
                torch._dynamo.reset()
                ck = torch.compile(kstep, fullgraph=True, mode=mode)
                ct = torch.compile(tstep, fullgraph=True, mode=mode)
                ko = [o.clone() for o in ck(*inputs)]  # CUDA-graph outputs are reused
                to = [o.clone() for o in ct(*inputs)]
                for a, b in zip(ko, to):
                    torch.testing.assert_close(a.float(), b.float(), atol=3e-2, rtol=3e-2)
                uk = time_us(ck, inputs, args.reps, args.rounds)
                ut = time_us(ct, inputs, args.reps, args.rounds)
                if mode == "default":  # the same kernels are what the CUDA graph replays
                    counts = (kernel_count(ck, inputs), kernel_count(ct, inputs))
                print(f"{label:<20} {t:>4} {mode:<16} {uk:>9.2f} {counts[0]:>8} {ut:>12.2f} "
                      f"{counts[1]:>8} {ut / uk:>6.2f}")


if __name__ == "__main__":
    main()
