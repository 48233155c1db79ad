#!/usr/bin/env bash
# attention.decode on the H200 in one device call (docs/performance.md, "Seventh round"):
# Release build, the attention GPU tests, compute-sanitizer memcheck of the decode tests,
# vs_torch.py's decode cases, EXTRA (more shell commands), the variant benchmark if
# VARIANTS=1. Logs into $OUT. Knobs: VS_ARGS (more vs_torch options), CTEST_R (tests to
# run; default Attention), CTEST_S, MEMCHECK=0 (skip), VARIANTS=1, EXTRA.
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DPython3_EXECUTABLE=$PY "${dl[@]}" >"$L/configure.log" 2>&1 || { tail -30 "$L/configure.log"; exit 1; }
cmake --build build -j16 >"$L/build.log" 2>&1 || { grep -E "error" "$L/build.log" | head -40; exit 1; }
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout ${CTEST_S:-240} ctest --test-dir build -j8 --output-on-failure -R "${CTEST_R:-Attention}" >"$L/ctest.log" 2>&1
echo "ctest: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|Failure|mismatches" "$L/ctest.log" | head -30
if [ "${MEMCHECK:-1}" = 1 ]; then
  t=$(find build -name attention_test -type f -perm -u+x | head -1)
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
    --gtest_filter='*Decode*:AttentionGpu.GpuMatchesCpu*' >"$L/memcheck.log" 2>&1
  echo "memcheck rc=$? at $SECONDS s: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck.log" | tail -3 | tr '\n' ' ')"
fi
# vs_torch's decode cases, torch.compile included (the A/B against the FMA design and the
# 4-warp shape ran at a2822ab with its KREG_DECODE_KERNEL knob: performance.md, "Seventh round").
timeout ${VS_S:-240} $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vs-decode --only attention.decode \
  ${VS_ARGS:-} >"$L/vs_decode.log" 2>&1
grep -E "^attention|copy bandwidth" "$L/vs_decode.log" | cut -c1-200
[ -n "${EXTRA:-}" ] && eval "$EXTRA" 2>&1 | tee "$L/extra.log"
if [ "${VARIANTS:-0}" = 1 ]; then
  (cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 decode_mma_bench.cu -o /tmp/dm &&
    timeout 150 /tmp/dm) >"$L/variants.log" 2>&1
  tail -25 "$L/variants.log"
fi
echo "done at $SECONDS s"
