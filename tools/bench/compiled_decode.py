#!/usr/bin/env python3
"""kreg ops inside a compiled torch graph at decode shapes, against Inductor's own kernels.

One step of a decoder layer's elementwise part, written twice:
  kreg:  y, r = fused_add_rmsnorm(x, res, w); z = silu_and_mul(y); o = rmsnorm(z, w2)
  torch: the same math in torch ops, which Inductor fuses into kernels of its own
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


def torch_step(x, res, w, w2):
    s = x.float() + res.float()
    r = s.to(x.dtype)
    y = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)
    d = y.shape[-1] // 2
    z = (torch.nn.functional.silu(y[:, :d].float()) * y[:, d:].float()).to(x.dtype)
    zf = z.float()
    o = (zf * torch.rsqrt(zf.pow(2).mean(-1, keepdim=True) + EPS) * w2.float()).to(x.dtype)
    return o, r


def kreg_step(x, res, w, w2):
    y, r = kt.ops.layernorm.fused_add_rmsnorm(x, res, w, eps=EPS)
    z = kt.ops.activation.silu_and_mul(y)
    o = kt.ops.layernorm.rmsnorm(z, w2, eps=EPS)
    return o, r


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
          f"fused_add_rmsnorm -> silu_and_mul -> rmsnorm; us per step (median of {args.rounds}x{args.reps})")
    print(f"{'T':>4} {'mode':<16} {'kreg us':>9} {'kernels':>8} {'inductor us':>12} {'kernels':>8} {'ratio':>6}")
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
            ck = torch.compile(kreg_step, fullgraph=True, mode=mode)
            ct = torch.compile(torch_step, fullgraph=True, mode=mode)
            ko, kr = ck(*inputs)
            to, tr = ct(*inputs)
            torch.testing.assert_close(ko.float(), to.float(), atol=3e-2, rtol=3e-2)
            torch.testing.assert_close(kr, tr)
            uk = time_us(ck, inputs, args.reps, args.rounds)
            ut = time_us(ct, inputs, args.reps, args.rounds)
            if mode == "default":  # the same kernels are what the CUDA graph replays
                counts = (kernel_count(ck, inputs), kernel_count(ct, inputs))
            print(f"{t:>4} {mode:<16} {uk:>9.2f} {counts[0]:>8} {ut:>12.2f} {counts[1]:>8} {ut / uk:>6.2f}")


if __name__ == "__main__":
    main()
