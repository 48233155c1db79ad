"""Why is kreg's residual_gate_add / copy_rows slower under vs_torch.py than its kernel
(ncu 282 us, scratch 282.7 us) while torch.compile gets 278? Same method as vs_torch
(events per call, back-to-back, one set), variants of the data and the output buffer."""
import os, statistics, sys, torch, kreg
sys.path.insert(0, "tools/bench")
reg = kreg.open(os.environ.get("KREG_MANIFEST", "registry.yaml"))
bf = torch.bfloat16

def time_events(fn, reps=50):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    e = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        s[i].record(); fn(); e[i].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in zip(s, e)) * 1e3

def time_block(fn, reps=50):
    """One event pair around all reps: per-call time without per-call event gaps."""
    for _ in range(3): fn()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): fn()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps

B, S, H = 16, 4096, 3072
g = reg.op("diffusion.residual_gate_add")
r = torch.randn(B, S, H, device="cuda").to(bf); x = torch.randn(B, S, H, device="cuda").to(bf)
gate = torch.randn(B, H, device="cuda").to(bf); out = torch.empty(B, S, H, device="cuda", dtype=bf)
ref = lambda: (r.float() + gate.float()[:, None, :] * x.float()).to(bf)
comp = torch.compile(ref)
rows = []
def add(row):
    rows.append(row)
    print(f"{row[0]:42s} events/call {row[1]:8.2f} us   block/call {row[2]:8.2f} us", flush=True)

add(("gate kreg, out fixed", time_events(lambda: g(r, x, gate, out)), time_block(lambda: g(r, x, gate, out))))
add(("gate kreg, out fresh each call", time_events(lambda: g(r, x, gate, torch.empty_like(x))), time_block(lambda: g(r, x, gate, torch.empty_like(x)))))
add(("gate torch.compile", time_events(comp), time_block(comp)))
rc, xc = torch.full_like(r, 0.5), torch.full_like(x, 0.25)
add(("gate kreg, constant data", time_events(lambda: g(rc, xc, gate, out)), time_block(lambda: g(rc, xc, gate, out))))
add(("gate kreg, out = residual (in place)", time_events(lambda: g(r, x, gate, r)), time_block(lambda: g(r, x, gate, r))))
del r, x, out, rc, xc
torch.cuda.empty_cache()

cr = reg.op("memory.copy_rows")
src = torch.randn(16384, 4096, device="cuda").to(bf); dst = torch.zeros(32768, 4096, device="cuda", dtype=bf)
off = torch.tensor([8192], device="cuda"); cnt = torch.tensor([16384], device="cuda", dtype=torch.int32)
add(("copy kreg", time_events(lambda: cr(src, dst, off, cnt, offset_on_src=False)), time_block(lambda: cr(src, dst, off, cnt, offset_on_src=False))))
add(("copy torch clone", time_events(lambda: src.clone()), time_block(lambda: src.clone())))
add(("copy torch dst[8192:8192 + 16384].copy_(src)", time_events(lambda: dst[8192:8192 + 16384].copy_(src)), time_block(lambda: dst[8192:8192 + 16384].copy_(src))))
