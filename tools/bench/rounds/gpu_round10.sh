#!/usr/bin/env bash
# Issue 17, tenth round, one device call, each step skipped once $SECONDS passes its deadline
# (UNTIL, default 560):
#  1. Release build; the diffusion GPU tests (group_norm_silu's cluster two-pass kernel, now
#     the plugin's, and the new shapes at the resident limit);
#  2. compute-sanitizer memcheck of the GPU tests that run group_norm_silu;
#  (Ran at 6fa2aa4, docs/performance.md eleventh round; both patches then left tools/bench/ab:
#  gns_chunk_2048 was merged in fe6c746, gns_max_chunk_4096 superseded by it.)
#  3. A/B of plugin builds, two rounds: HEAD against tools/bench/ab/gns_max_chunk_4096.patch
#     (groups of 16385..32768 vectors also take the two-pass kernel, chunks up to 4096) and
#     gns_chunk_2048.patch (chunks of ~2048 vectors, half the blocks), vs_torch's
#     group_norm_silu cases (no torch.compile: kreg against kreg);
#  4. the diffusion GPU tests with each patch applied (so that the winner needs no second
#     call), the tree restored after;
#  5. decode_mma_bench.cu: V5p/V8 and the chain timing behind a producer kernel (PDL);
#  6. vs_torch's diffusion rows with torch.compile (the before/after table's numbers);
#  7. the whole ctest suite.
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
UNTIL=${UNTIL:-560}
left() { [ $SECONDS -lt $((UNTIL - ${1:-0})) ]; }
source tools/bench/gpu_common.sh
(cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 decode_mma_bench.cu -o /tmp/dm) >/tmp/dm_build.log 2>&1 &
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout 120 ctest --test-dir build -j8 --output-on-failure -R Diffusion >"$L/ctest_diffusion.log" 2>&1
echo "diffusion ctest rc=$?: $(grep -E 'tests passed' "$L/ctest_diffusion.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT)|Failure|mismatch" "$L/ctest_diffusion.log" | head -20
# compute-sanitizer memcheck of the GPU tests that run group_norm_silu (the shape sweep and
# the misaligned views), at most MEMCHECK_S seconds.
t=$(find build -name diffusion_test -type f -perm -u+x | head -1)
timeout ${MEMCHECK_S:-150} compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
  --gtest_filter='GpuDiffusionKernels.MatchTheCpuReferenceOverAShapeSweep:GpuDiffusionKernels.MisalignedViews' \
  >"$L/memcheck.log" 2>&1
echo "memcheck rc=$? at $SECONDS s: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck.log" | tail -3 | tr '\n' ' ')"
if left 150; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only group_norm_silu --out /tmp/gab 2>&1 | grep -E "^diffusion" | cut -c1-110' \
    max4096=tools/bench/ab/gns_max_chunk_4096.patch chunk2048=tools/bench/ab/gns_chunk_2048.patch 2>&1 | tee "$L/gns_ab.log"
  echo "A/B done at $SECONDS s"
fi
for p in gns_max_chunk_4096 gns_chunk_2048; do
  left 110 || break
  if patch -p1 -s <tools/bench/ab/$p.patch && cmake --build build -j16 >>/tmp/build.log 2>&1; then
    timeout 90 ctest --test-dir build -j8 --output-on-failure -R GpuDiffusion >"/tmp/ctest_$p.log" 2>&1
    echo "$p: diffusion ctest rc=$?: $(grep -E 'tests passed' "/tmp/ctest_$p.log") at $SECONDS s"
    grep -E "\((Failed|Timeout|SEGFAULT)|Failure|mismatch" "/tmp/ctest_$p.log" | head -10
  else
    echo "$p: does not apply or build"
  fi
  patch -R -p1 -s <tools/bench/ab/$p.patch
  cmake --build build -j16 >>/tmp/build.log 2>&1
done
# decode_mma_bench: every variant (V5p and V8 included) and the chain timing (a producer
# kernel, then split + merge: V5 without PDL, V5p, V8 with the history prefetched before
# griddepcontrol.wait).
if left 80; then
  wait
  timeout 75 /tmp/dm 2>&1 | grep -E "^(V5|V8|==|--)|chain|FAIL|ALL OK|CHECK" | cut -c1-190 | tail -60
  echo "decode bench done at $SECONDS s"
fi
if left 60; then
  timeout $((UNTIL - SECONDS - 50)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vsd --only group_norm_silu >/tmp/vsd.log 2>&1
  grep -E "^diffusion|copy bandwidth|MISMATCH" /tmp/vsd.log | cut -c1-200
fi
if left 40; then
  timeout $((UNTIL - SECONDS - 10)) ctest --test-dir build -j10 --output-on-failure >"$L/ctest.log" 2>&1
  echo "whole ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
  grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed" "$L/ctest.log" | head -20
fi
echo "done at $SECONDS s"
