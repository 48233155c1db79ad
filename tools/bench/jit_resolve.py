#!/usr/bin/env python3
"""Cold and warm resolve of a JIT specialization (docs/jit.md), on a GPU.

Each measurement is a fresh process (so nothing is cached in memory) that opens the
registry, makes CUDA tensors, and times the first call of layernorm.rmsnorm through
kreg.Op: resolve, which specializes (H, dtype), then the launch. The same call's second
run (the launch alone) is subtracted, so the figure is the resolve: with an empty cache
it includes the NVRTC compile; with a warm cache the cache read, the checksum and the
driver's library load. Prints the median of several processes each way.

    PYTHONPATH=build/python python3 tools/bench/jit_resolve.py [--runs 7] [--h 4097]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys, time, torch, kreg
reg = kreg.open(os.environ["KREG_MANIFEST"])
h = int(sys.argv[1])
x = torch.randn(64, h, device="cuda").to(torch.bfloat16)
w = torch.randn(h, device="cuda").to(torch.bfloat16)
out = torch.empty_like(x)
op = reg.op("layernorm.rmsnorm")
torch.cuda.synchronize()
t0 = time.perf_counter(); op(x, w, out); torch.cuda.synchronize(); t1 = time.perf_counter()
op(x, w, out); torch.cuda.synchronize(); t2 = time.perf_counter()
ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2), "wrong result"
print(op.resolved_backend, (t1 - t0) - (t2 - t1))
"""


def one(h, cache):
    env = dict(os.environ, KREG_JIT_CACHE=cache)
    r = subprocess.run([sys.executable, "-c", CHILD, str(h)], env=env, capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"child failed:\n{r.stdout}\n{r.stderr}")
    backend, seconds = r.stdout.split()
    return backend, float(seconds)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--h", type=int, default=4097)
    a = p.parse_args()
    cold, warm = [], []
    for i in range(a.runs):
        with tempfile.TemporaryDirectory() as d:
            b, s = one(a.h, d)  # empty cache: compile
            cold.append(s)
            b2, s2 = one(a.h, d)  # warm cache: read + load
            warm.append(s2)
    print(f"layernorm.rmsnorm H={a.h} bf16 [{b}]: resolve with an empty cache "
          f"{1e3 * statistics.median(cold):.1f} ms (min {1e3 * min(cold):.1f}), "
          f"with a warm cache {1e3 * statistics.median(warm):.2f} ms (min {1e3 * min(warm):.2f}), "
          f"median of {a.runs} fresh processes each")


if __name__ == "__main__":
    main()
