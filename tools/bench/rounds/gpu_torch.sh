#!/usr/bin/env bash
# The torch integration evidence on a GPU machine (issue 14): a Release build against the
# machine's torch (the Python given as $PY, default /opt/torch/.venv/bin/python3), the
# Python test files (kreg, torch_samples, kreg_torch: opcheck, torch.compile fullgraph,
# reduce-overhead, chains, reload), the per-op table, host time per call pinned to one
# core (py_overhead.py) and the compiled decode step against Inductor (compiled_decode.py).
# Run from the repository root; .deps/ (../shared/device/prep-carry.sh) provides DLPack if missing.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p $out
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$PY "${dl[@]}" >$out/configure.log 2>&1 || { tail -30 $out/configure.log; exit 1; }
grep "kreg.torch\|kreg: Python" $out/configure.log
cmake --build build -j16 >$out/build.log 2>&1 || { grep -E "error" $out/build.log | head -30; exit 1; }
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_BUILD_DIR=$PWD/build KREG_MANIFEST=$PWD/registry.yaml
${KREG_CTEST:-true} && { ctest --test-dir build -j8 --output-on-failure -E python >$out/ctest.log 2>&1; echo "ctest (without python): $(grep -E 'tests passed' $out/ctest.log)"; grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $out/ctest.log | head -20; }
run_pytest() {  # name, file, -k expression
  PYTHONUNBUFFERED=1 timeout ${KREG_PYTEST_TIMEOUT:-480} $PY -m pytest -v -p no:cacheprovider -rfs tests/python/$2.py ${3:+-k "$3"} >$out/$1.log 2>&1
  echo "$1: $(tail -1 $out/$1.log)"; grep -E "^(FAILED|ERROR)" $out/$1.log | cut -c1-400 | head -40
}
# Three processes at once (the compile tests dominate): CPU and the registration tests,
# CUDA eager and opcheck, CUDA compile.
if ${KREG_PYTESTS:-true}; then
run_pytest torch_cpu test_kreg_torch "not cuda" &
run_pytest torch_cuda_eager test_kreg_torch "cuda and (opcheck or eager or workspace)" &
run_pytest torch_cuda_compile test_kreg_torch "cuda and not (opcheck or eager or workspace)" &
run_pytest samples test_torch_samples "" &
run_pytest kreg test_kreg "" &
wait
# The per-op table: one row per (op, device), one column per test.
cat $out/torch_*.log | $PY -c '
import re, sys, collections
rows = collections.defaultdict(dict)
for line in sys.stdin:
    m = re.match(r"\S*::test_(eager_matches_kreg|opcheck|compile_fullgraph|reduce_overhead_cuda_graphs)\[(\S+)-(cpu|cuda)\] (PASSED|FAILED|SKIPPED|ERROR)", line)
    if m:
        rows[(m[2], m[3])][m[1]] = m[4].lower()
cols = ["eager_matches_kreg", "opcheck", "compile_fullgraph", "reduce_overhead_cuda_graphs"]
print("| op | device | eager = kreg.Op | opcheck | fullgraph, 0 breaks | reduce-overhead |")
print("|---|---|---|---|---|---|")
for (op, dev) in sorted(rows):
    print(f"| {op} | {dev} | " + " | ".join(rows[(op, dev)].get(c, "-") for c in cols) + " |")
' | tee $out/per_op_table.md
fi
$PY tools/bench/py_overhead.py --calls 100000 --core ${CORE:-3} 2>&1 | tee $out/py_overhead.txt
for pdl in "" --pdl; do
  $PY tools/bench/compiled_decode.py $pdl 2>&1 | grep -v "_warn_once\|Profiler clears\|cudagraph_utils" | tee -a $out/compiled_decode.txt
done
# Everything else in one file (a device run returns at most 8).
tar -C $out -czf $out/logs.tgz --remove-files $(cd $out && ls *.log)
