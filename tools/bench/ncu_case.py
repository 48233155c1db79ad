"""Runs the kreg side of vs_torch.py cases a few times, for a profiler to attach to:

    ncu --set full -k regex:sampling python3 tools/bench/ncu_case.py --only "top_k_top_p_sampling_from_probs B=1"

Each matching case (the same cases/*.py modules and --only substrings as vs_torch.py) is
made once and its kreg call run --calls times after a warm-up, synchronized, with the case
label printed; nothing is timed here (vs_torch.py times, the profiler measures).
"""

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import vs_torch  # noqa: E402  (the case loader; imports torch and puts build/python on the path)

import torch  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=os.environ.get("KREG_MANIFEST", str(vs_torch.ROOT / "registry.yaml")))
    parser.add_argument("--only", required=True, help="comma-separated substrings of 'op shape'")
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    import kreg

    reg = kreg.open(args.manifest)
    failures = []
    cases = list(vs_torch.load_cases([s for s in args.only.split(",") if s], failures))
    for f in failures:
        print(f, file=sys.stderr)
    if not cases:
        sys.exit(f"ncu_case.py: no case matches {args.only!r}")
    for case in cases:
        op = reg.op(case["op"])
        t = case["make"]()
        case["kreg"](op, t)  # warm-up: resolution, JIT, first-touch
        torch.cuda.synchronize()
        for _ in range(args.calls):
            case["kreg"](op, t)
        torch.cuda.synchronize()
        print(f"ran {case['op']} {case['shape']} x{args.calls}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
