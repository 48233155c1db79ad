#!/usr/bin/env bash
# Issue 17, eighth round, in one device call (docs/performance.md, "Eighth round"), in order
# of priority, each step skipped once $SECONDS passes its deadline (UNTIL, default 560):
#  1. Release build; ctest -R $CTEST_R (default the attention, diffusion and lplb tests);
#  2. vs_torch.py (no torch.compile) on the decode and small timestep cases, with the copy
#     of each case's own bytes (% size copy);
#  3. the variant benches ts_small.cu and lplb_solve_bench.cu (compiled while 1 runs);
#  4. decode A/B: HEAD against tools/bench/ab/decode_before_early.patch, two rounds;
#  5. lplb: lplb_demo on HEAD, then tools/bench/ab/lplb_v3.patch applied, the lplb plugin
#     rebuilt, the lplb tests and lplb_demo again (skipped without the patch);
#  6. compute-sanitizer memcheck of the decode tests; 7. the dispatch bench; EXTRA.
# Logs into $OUT.
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
PY=${PY:-/opt/torch/.venv/bin/python3}
UNTIL=${UNTIL:-560}
left() { [ $SECONDS -lt $((UNTIL - ${1:-0})) ]; }
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
(cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 ts_small.cu -o /tmp/ts &&
  nvcc -O3 -arch=sm_90 -std=c++17 lplb_solve_bench.cu -o /tmp/lsb) >"$L/variants_build.log" 2>&1 &
vb=$!
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DPython3_EXECUTABLE=$PY "${dl[@]}" >"$L/configure.log" 2>&1 || { tail -30 "$L/configure.log"; exit 1; }
cmake --build build -j16 >"$L/build.log" 2>&1 || { grep -E "error" "$L/build.log" | head -40; exit 1; }
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout ${CTEST_S:-200} ctest --test-dir build -j8 --output-on-failure -R "${CTEST_R:-Attention|Diffusion|Lplb}" >"$L/ctest.log" 2>&1
echo "ctest: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|Failure|mismatches" "$L/ctest.log" | head -30
left 100 && timeout 120 $PY tools/bench/vs_torch.py --reps 30 --no-compile --out "$L/vs" \
  --only "attention.decode,timestep_embedding N=2,timestep_embedding N=16" >"$L/vs.log" 2>&1
grep -E "^attention|^diffusion|copy bandwidth|MISMATCH" "$L/vs.log" | cut -c1-170
wait $vb; echo "variants built (rc $?) at $SECONDS s"
left 60 && timeout 30 /tmp/ts 2>&1 | tee "$L/ts_small.log"
left 60 && timeout 90 /tmp/lsb 200 >"$L/lplb_bench.log" 2>&1
grep -E "FAIL|ALL OK|^V[0-9]|demo|  V" "$L/lplb_bench.log" | head -60
echo "variants ran at $SECONDS s"
if left 200; then
  bash tools/bench/gpu_plugin_ab.sh attention 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only attention.decode --out /tmp/vsab 2>&1 | grep -E "^attention" | cut -c35-130' \
    before=tools/bench/ab/decode_before_early.patch 2>&1 | tee "$L/decode_ab.log"
  echo "decode A/B done at $SECONDS s"
fi
demo=./build/tools/lplb_demo/lplb_demo
if [ -f tools/bench/ab/lplb_v3.patch ] && left 90; then
  for r in 1 2; do timeout 20 $demo --device cuda 2>&1 | grep -iE "solve|iter" | sed "s/^/HEAD r$r: /"; done
  if patch -p1 -s <tools/bench/ab/lplb_v3.patch && cmake --build build -j16 >>"$L/build.log" 2>&1; then
    timeout 90 ctest --test-dir build -j8 --output-on-failure -R Lplb >"$L/ctest_lplb_v3.log" 2>&1
    echo "V3 ctest: $(grep -E 'tests passed' "$L/ctest_lplb_v3.log")"
    grep -E "\((Failed|Timeout|SEGFAULT)|Failure" "$L/ctest_lplb_v3.log" | head
    for r in 1 2; do timeout 20 $demo --device cuda 2>&1 | grep -iE "solve|iter" | sed "s/^/V3 r$r: /"; done
    patch -R -p1 -s <tools/bench/ab/lplb_v3.patch && cmake --build build -j16 >>"$L/build.log" 2>&1
  else
    echo "lplb_v3.patch: does not apply or build"
  fi
  echo "lplb done at $SECONDS s"
fi
if [ "${MEMCHECK:-1}" = 1 ] && left 60; then
  t=$(find build -name attention_test -type f -perm -u+x | head -1)
  timeout $((UNTIL - SECONDS - 20)) compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
    --gtest_filter='*Decode*' >"$L/memcheck.log" 2>&1
  echo "memcheck rc=$? at $SECONDS s: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck.log" | tail -3 | tr '\n' ' ')"
fi
if left 30; then
  taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_filter='Direct|Handle' 2>&1 | grep -E "median" | tee "$L/dispatch.log"
fi
[ -n "${EXTRA:-}" ] && left 20 && eval "$EXTRA" 2>&1 | tee "$L/extra.log"
echo "done at $SECONDS s"
