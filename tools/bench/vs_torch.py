#!/usr/bin/env python3
"""kreg next to PyTorch eager and torch.compile: correctness, time, % of copy bandwidth.

Runs every case that tools/bench/cases/*.py yields (`cases()`, one dict per op and shape;
the interface is in tools/bench/cases/README.md). For each case:

1. make() builds the inputs and kreg's output buffers; a clone of them is kept for torch.
2. kreg runs once; check(t) (kreg's results) is compared in order with torch(clone), with
   the case's (atol, rtol); integer results must match exactly. A mismatch fails the run
   (exit status 1, listed at the end) but the other cases still run.
3. kreg, torch eager and torch.compile (mode "default"; a compile failure is reported, not
   fatal) are timed. kreg's pure output buffers (the case's `fresh` keys, by default
   "out") are allocated inside each timed call, as torch allocates its results. Large cases: one call per pair of CUDA events, rotating over enough
   make() sets to exceed --rotate-mb (the H200's L2 is 60 MB), median of --reps calls.
   small=True (decode-sized) cases: a CUDA graph of --graph-calls calls (kreg captured on
   torch's current stream like torch's own kernels), median of --reps replays, per call.
4. The device copy bandwidth (torch copy of a 1 GiB buffer, bytes read + written per
   second) is measured in the same run; each case reports GB/s from its `bytes` (the
   fewest bytes one call must move) and that as a percentage of the copy bandwidth.
   Cases that cross the host link (link="d2h" or "h2d") are measured against that link
   instead: GB/s of their `link_bytes` (the payload crossing it) as a percentage of a
   256 MiB pinned <-> device copy in the same direction, timed in the same run.
5. A copy of the case's own byte count (half read, half written; the same rotation and
   the same timing, graph or events) is timed too: "% size copy" is kreg's time against
   it. At decode sizes no kernel reaches the 1 GiB copy's bandwidth (launch, the first
   round trip and the tail are a large part of a few µs): this is the bound at that size.

Writes a CSV, a Markdown table (for docs/performance.md) and a PNG chart (% of copy
bandwidth, kreg vs torch.compile; skipped with a message without matplotlib).

    PYTHONPATH=build/python python3 tools/bench/vs_torch.py --out vs-torch
    python3 tools/bench/vs_torch.py --only rmsnorm,silu --reps 50
    python3 tools/bench/vs_torch.py --list
"""

import argparse
import csv
import importlib.util
import math
import os
import pathlib
import statistics
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES_DIR = pathlib.Path(__file__).resolve().parent / "cases"
sys.path.insert(0, str(ROOT / "build" / "python"))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

SMALL_SETS = 4  # input sets rotated inside a captured graph
MAX_SETS = 64


# ---- Cases ----


def load_cases(only, failures):
    """Every case of every cases/*.py module (import errors become failures)."""
    for path in sorted(CASES_DIR.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            spec = importlib.util.spec_from_file_location(f"kreg_bench_cases_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            cases = list(module.cases())
        except Exception:  # noqa: BLE001 - report and keep going
            failures.append(f"cases/{path.name}: cannot load: {traceback.format_exc(limit=3)}")
            continue
        for case in cases:
            missing = {"op", "shape", "make", "kreg", "torch", "check", "tol", "bytes"} - set(case)
            if case.get("link"):
                missing |= {"link_bytes"} - set(case)
            if missing:
                failures.append(f"cases/{path.name}: a case lacks {sorted(missing)}: {case.get('op')}")
                continue
            label = f"{case['op']} {case['shape']}"
            if only and not any(s in label for s in only):
                continue
            case.setdefault("small", False)
            case["source"] = path.name
            yield case


def tensors_of(t):
    return [v for v in t.values() if isinstance(v, torch.Tensor)]


def clone_set(t):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}


def set_bytes(t):
    return sum(v.numel() * v.element_size() for v in tensors_of(t))


# ---- Correctness ----


def compare(got, want, tol):
    """Problems found comparing kreg's results with torch's, as strings (empty: equal)."""
    atol, rtol = tol
    got, want = tuple(got), tuple(want)
    if len(got) != len(want):
        return [f"check() returned {len(got)} tensors, torch() {len(want)}"]
    problems = []
    for i, (g, w) in enumerate(zip(got, want)):
        if tuple(g.shape) != tuple(w.shape):
            problems.append(f"result {i}: shape {tuple(g.shape)} vs torch {tuple(w.shape)}")
            continue
        if g.numel() == 0:
            continue
        if not g.is_floating_point() or not w.is_floating_point():
            bad = g.long() != w.long()
            n = int(bad.sum())
            if n:
                idx = bad.flatten().nonzero()[0].item()
                problems.append(f"result {i}: {n}/{g.numel()} integers differ (first at flat "
                                f"index {idx}: {g.flatten()[idx].item()} vs {w.flatten()[idx].item()})")
            continue
        gf, wf = g.double(), w.double()
        ok = torch.isclose(gf, wf, rtol=rtol, atol=atol)
        n = int((~ok).sum())
        if n:
            err = (gf - wf).abs().nan_to_num(nan=math.inf)
            idx = int(err.flatten().argmax())
            problems.append(
                f"result {i}: {n}/{g.numel()} values outside atol={atol} rtol={rtol} "
                f"(max |diff| {err.max().item():.4g} at flat index {idx}: "
                f"{gf.flatten()[idx].item():.6g} vs torch {wf.flatten()[idx].item():.6g})")
    return problems


# ---- Timing ----


def time_events(fn, sets, reps):
    """Median microseconds of one call, each call between its own pair of CUDA events."""
    for i in range(3):
        fn(sets[i % len(sets)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        t = sets[i % len(sets)]
        starts[i].record()
        fn(t)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e3


def time_graph(fn, sets, reps, calls):
    """Median microseconds per call over `reps` replays of a CUDA graph of `calls` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (resolution, compilation) outside the capture
        for i in range(3):
            fn(sets[i % len(sets)])
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(sets[i % len(sets)])
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
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def copy_bandwidth(reps):
    """GB/s of a device-to-device copy of 1 GiB, counting bytes read plus bytes written."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    src.random_(0, 256)
    dst = torch.empty_like(src)
    us = time_events(lambda _: dst.copy_(src), [None], reps)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (us * 1e-6) / 1e9


def link_bandwidth(direction, reps):
    """GB/s of a 256 MiB copy between page-locked host memory and the device (payload)."""
    n = 256 << 20
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    if direction == "d2h":
        us = time_events(lambda _: host.copy_(dev, non_blocking=True), [None], reps)
    else:
        us = time_events(lambda _: dev.copy_(host, non_blocking=True), [None], reps)
    del dev, host
    torch.cuda.empty_cache()
    return n / (us * 1e-6) / 1e9


class Baselines:
    """The copy bandwidths cases are compared with, each measured once, on first use."""

    def __init__(self, reps):
        self.reps = reps
        self.device = copy_bandwidth(reps)
        self.links = {}

    def of(self, case):
        """(GB/s, name) of the case's baseline."""
        link = case.get("link")
        if not link:
            return self.device, "device copy"
        if link not in ("d2h", "h2d"):
            raise ValueError(f"link must be 'd2h' or 'h2d', not {link!r}")
        if link not in self.links:
            self.links[link] = link_bandwidth(link, self.reps)
            print(f"pinned {link} copy bandwidth: {self.links[link]:.1f} GB/s")
        return self.links[link], f"{link} memcpy"


# ---- One case ----


def run_case(reg, case, args, baselines):
    """A result row; raises on errors in the case itself (make, kreg, torch)."""
    op = reg.op(case["op"])
    first = case["make"]()
    reference = clone_set(first)
    case["kreg"](op, first)
    torch.cuda.synchronize()
    got = tuple(case["check"](first))
    want = tuple(case["torch"](reference))
    torch.cuda.synchronize()
    problems = compare(got, want, case["tol"])
    del reference, got, want

    small = bool(case["small"])
    one = set_bytes(first)
    if small:
        count = SMALL_SETS
    else:
        count = min(MAX_SETS, max(1, math.ceil(args.rotate_mb * 1e6 / max(one, 1))))
    sets = [first] + [case["make"]() for _ in range(count - 1)]
    torch.cuda.synchronize()

    def timed(fn, on=None):
        on = sets if on is None else on
        if small:
            return time_graph(fn, on, args.reps, args.graph_calls)
        return time_events(fn, on, args.reps)

    kreg_fn = case["kreg"]
    torch_fn = case["torch"]
    # kreg's pure outputs are allocated per timed call, as torch's own are inside torch_fn:
    # both then write into a block the caching allocator just freed, not into one of the
    # rotating sets' buffers (a placement difference worth ~5% on residual_gate_add).
    fresh = [] if args.fixed_outputs else [k for k in case.get("fresh", ("out",)) if k in first]

    def kreg_call(t):
        if fresh:
            t = dict(t)
            for k in fresh:
                t[k] = torch.empty_like(t[k])
        kreg_fn(op, t)

    us_kreg = timed(kreg_call)
    us_eager = timed(torch_fn)
    us_compile, note = None, ""
    if not args.no_compile:
        try:
            torch._dynamo.reset()  # cases share their lambdas' code objects: no recompile limit
            compiled = torch.compile(torch_fn, mode="default", dynamic=False)
            cgot = tuple(compiled(clone_set(sets[0])))
            cwant = tuple(torch_fn(clone_set(sets[0])))
            if compare(cgot, cwant, case["tol"]):
                note = "torch.compile result differs from eager"
            del cgot, cwant
            us_compile = timed(compiled)
        except Exception as e:  # noqa: BLE001 - a compile failure is reported, not fatal
            note = f"torch.compile failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            print(f"  {note}", file=sys.stderr)
    del sets, first
    torch.cuda.empty_cache()

    # A host-link case counts the payload crossing the link, against that link's memcpy.
    nbytes = case["link_bytes"] if case.get("link") else case["bytes"]
    base_gbps, base_name = baselines.of(case)
    us_size_copy = None
    if not case.get("link") and not args.no_size_copy:
        half = max(1, nbytes // 2)
        copies = [(torch.empty(half, dtype=torch.uint8, device="cuda").random_(0, 256),
                   torch.empty(half, dtype=torch.uint8, device="cuda")) for _ in range(count)]
        us_size_copy = timed(lambda c: c[1].copy_(c[0]), copies)
        del copies
        torch.cuda.empty_cache()

    def gbps(us):
        return nbytes / (us * 1e-6) / 1e9 if us else None

    def pct(us):
        return 100 * gbps(us) / base_gbps if us else None

    return dict(
        op=case["op"],
        shape=case["shape"],
        small=small,
        timing="graph" if small else "events",
        bytes=nbytes,
        baseline=base_name,
        baseline_gbps=base_gbps,
        sets=count,
        kreg_us=us_kreg,
        eager_us=us_eager,
        compile_us=us_compile,
        kreg_gbps=gbps(us_kreg),
        eager_gbps=gbps(us_eager),
        compile_gbps=gbps(us_compile),
        kreg_pct_copy=pct(us_kreg),
        eager_pct_copy=pct(us_eager),
        compile_pct_copy=pct(us_compile),
        size_copy_us=us_size_copy,
        kreg_pct_size_copy=(100 * us_size_copy / us_kreg) if us_size_copy else None,
        speedup_eager=us_eager / us_kreg,
        speedup_compile=(us_compile / us_kreg) if us_compile else None,
        correct=not problems,
        note=note,
    ), problems


# ---- Reports ----


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def write_csv(path, rows):
    fields = list(rows[0].keys())
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else (round(r[k], 3) if isinstance(r[k], float) else r[k]))
                        for k in fields})


def write_markdown(path, rows, copy_gbps, device):
    lines = [
        f"Device copy bandwidth: {copy_gbps:.0f} GB/s ({device}, torch {torch.__version__}). "
        "Times in µs per call (median); decode-sized rows replay CUDA graphs. "
        "% copy = GB/s of the minimum bytes moved / copy bandwidth; rows marked h2d/d2h "
        "cross the host link and are compared with a pinned memcpy in that direction "
        "(payload bytes). % size copy = a copy of the same byte count, timed the same way, "
        "over kreg's time.",
        "",
        "| op | shape | kreg µs | eager µs | compile µs | kreg GB/s | kreg % copy | compile % copy "
        "| size copy µs | kreg % size copy | × eager | × compile |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        flag = "" if r["correct"] else " **MISMATCH**"
        if r["baseline"] != "device copy":
            flag += f" ({r['baseline']})"
        lines.append(
            f"| {r['op']}{flag} | {r['shape']} | {fmt(r['kreg_us'], '.2f')} | {fmt(r['eager_us'], '.2f')} "
            f"| {fmt(r['compile_us'], '.2f')} | {fmt(r['kreg_gbps'], '.0f')} | {fmt(r['kreg_pct_copy'], '.1f')} "
            f"| {fmt(r['compile_pct_copy'], '.1f')} | {fmt(r['size_copy_us'], '.2f')} "
            f"| {fmt(r['kreg_pct_size_copy'], '.1f')} | {fmt(r['speedup_eager'], '.2f')} "
            f"| {fmt(r['speedup_compile'], '.2f')} |")
    notes = [f"- {r['op']} {r['shape']}: {r['note']}" for r in rows if r["note"]]
    if notes:
        lines += ["", *notes]
    pathlib.Path(path).write_text("\n".join(lines) + "\n")


def write_chart(path, rows, copy_gbps, device):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("vs_torch: matplotlib is not installed: no chart (pip install matplotlib)")
        return False
    labels = [f"{r['op']}  {r['shape']}" + ("" if r["baseline"] == "device copy" else f" (% of {r['baseline']})")
              for r in rows]
    kreg_pct = [r["kreg_pct_copy"] or 0 for r in rows]
    comp_pct = [r["compile_pct_copy"] or 0 for r in rows]
    y = range(len(rows))
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.38 * len(rows)))
    h = 0.38
    ax.barh([i - h / 2 for i in y], kreg_pct, height=h, label="kreg", color="#1f77b4")
    ax.barh([i + h / 2 for i in y], comp_pct, height=h, label="torch.compile", color="#ff7f0e")
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(100, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"% of device copy bandwidth ({copy_gbps:.0f} GB/s)")
    ax.set_title(f"kreg vs torch.compile on {device}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def print_table(rows):
    head = (f"{'op':<34} {'shape':<32} {'kreg us':>9} {'eager us':>9} {'compile':>9} "
            f"{'GB/s':>7} {'%copy':>6} {'%size':>6} {'x eager':>7} {'x comp':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['op'][:34]:<34} {r['shape'][:32]:<32} {fmt(r['kreg_us'], '9.2f')} "
              f"{fmt(r['eager_us'], '9.2f')} {fmt(r['compile_us'], '9.2f')} {fmt(r['kreg_gbps'], '7.0f')} "
              f"{fmt(r['kreg_pct_copy'], '6.1f')} {fmt(r['kreg_pct_size_copy'], '6.1f')} "
              f"{fmt(r['speedup_eager'], '7.2f')} "
              f"{fmt(r['speedup_compile'], '7.2f')}{'' if r['correct'] else '  MISMATCH'}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=os.environ.get("KREG_MANIFEST", str(ROOT / "registry.yaml")))
    parser.add_argument("--only", default="", help="comma-separated substrings of 'op shape' to run")
    parser.add_argument("--out", default="vs-torch", help="folder for the default outputs")
    parser.add_argument("--csv", help="CSV path (default OUT/vs_torch.csv)")
    parser.add_argument("--md", help="Markdown path (default OUT/vs_torch.md)")
    parser.add_argument("--png", help="chart path (default OUT/vs_torch.png)")
    parser.add_argument("--reps", type=int, default=100, help="timed calls (or graph replays)")
    parser.add_argument("--graph-calls", type=int, default=64, help="calls per captured graph")
    parser.add_argument("--rotate-mb", type=float, default=200, help="bytes of input sets to rotate over")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--fixed-outputs", action="store_true",
                        help="kreg writes into make()'s output buffers instead of fresh ones each call")
    parser.add_argument("--no-size-copy", action="store_true",
                        help="skip the copy of each case's byte count (the %% size copy column)")
    parser.add_argument("--pdl", action="store_true",
                        help="kreg's CUDA calls ask for programmatic dependent launch (kreg.set_pdl)")
    parser.add_argument("--stable-inputs", action="store_true",
                        help="with --pdl: vouch for each op's stable inputs (kreg.set_pdl(True, "
                        "stable_inputs=True)): kernels may read them before the previous kernel ends")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    if args.stable_inputs and not args.pdl:
        parser.error("--stable-inputs needs --pdl")
    only = [s.strip() for s in args.only.split(",") if s.strip()]

    failures = []
    cases = list(load_cases(only, failures))
    if args.list:
        for c in cases:
            print(f"{c['source']:<16} {c['op']:<36} {c['shape']:<34} {'small' if c['small'] else 'large'} "
                  f"{c['bytes']} B")
        for f in failures:
            print(f"FAILED: {f}")
        return 1 if failures else 0
    if not torch.cuda.is_available():
        sys.exit("vs_torch: needs torch with a CUDA device")
    import kreg

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path = args.csv or out / "vs_torch.csv"
    md_path = args.md or out / "vs_torch.md"
    png_path = args.png or out / "vs_torch.png"

    t0 = time.time()
    reg = kreg.open(args.manifest)
    kreg.set_pdl(args.pdl, stable_inputs=args.stable_inputs)
    device = torch.cuda.get_device_name()
    baselines = Baselines(max(args.reps, 20))
    copy_gbps = baselines.device
    print(f"device copy bandwidth: {copy_gbps:.0f} GB/s ({device}); {len(cases)} cases")

    rows = []
    for i, case in enumerate(cases):
        label = f"{case['op']} {case['shape']}"
        print(f"[{i + 1}/{len(cases)}] {label}", flush=True)
        try:
            row, problems = run_case(reg, case, args, baselines)
        except Exception:  # noqa: BLE001 - one broken case must not stop the report
            failures.append(f"{label} ({case['source']}): error: {traceback.format_exc(limit=4)}")
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            continue
        rows.append(row)
        write_csv(csv_path, rows)  # after every case: a run cut short keeps what it measured
        for p in problems:
            failures.append(f"{label} ({case['source']}): kreg differs from torch: {p}")
            print(f"  MISMATCH {p}", file=sys.stderr)

    if rows:
        print()
        print_table(rows)
        write_csv(csv_path, rows)
        write_markdown(md_path, rows, copy_gbps, device)
        wrote = [str(csv_path), str(md_path)]
        if write_chart(png_path, rows, copy_gbps, device):
            wrote.append(str(png_path))
        print(f"wrote {', '.join(wrote)} ({time.time() - t0:.0f} s)")
    if failures:
        print(f"\n{len(failures)} FAILURES:", file=sys.stderr)
        for f in failures:
            print(f"  - {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
