#!/usr/bin/env bash
# Issue 17, ninth round, in one device call, in order of priority, each step skipped once
# $SECONDS passes its deadline (UNTIL, default 570):
#  1. Release build (./build reused when there); the whole ctest suite (CTEST_S s at most);
#  2. diffusion A/B of plugin builds, two rounds: HEAD, tools/bench/ab/gns_cluster_two_pass.patch
#     and tools/bench/ab/timestep_param_table.patch, on vs_torch's group_norm_silu and small
#     timestep cases (no torch.compile: the A/B is kreg against kreg);
#  3. both patches applied to the tree, the diffusion plugin rebuilt, the diffusion GPU tests,
#     the patches reverted and the plugin rebuilt;
#  4. the timestep variant bench (ts_small.cu, compiled during 1);
#  5. vs_torch on the decode cases with the copy of each case's own bytes (% size copy);
#  5b. decode_mma_bench.cu (V5, the plugin's shape, against V7, whose last split block merges);
#  6. ncu of attention.decode B=1 ctx 4096 (speed of light, warp states, memory);
#  7. the dispatch bench.
# Compact stdout; a few logs into $OUT (the run returns at most 8 files).
# Ran once, at e1ba032 (docs/performance.md, tenth round); since then its two-pass patch is
# in the plugin (its step 2 and 3 need that tree: git worktree add /tmp/r9 e1ba032).
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
UNTIL=${UNTIL:-570}
left() { [ $SECONDS -lt $((UNTIL - ${1:-0})) ]; }
source tools/bench/gpu_common.sh
(cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 ts_small.cu -o /tmp/ts &&
  nvcc -O3 -arch=sm_90 -std=c++17 decode_mma_bench.cu -o /tmp/dm) >/tmp/ts_build.log 2>&1 &
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout ${CTEST_S:-200} ctest --test-dir build -j10 --output-on-failure -R "${CTEST_R:-.}" >"$L/ctest.log" 2>&1
echo "ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed|Failure" "$L/ctest.log" | head -30
if left 140; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only "group_norm_silu,timestep_embedding N=2,timestep_embedding N=16" --out /tmp/dab 2>&1 | grep -E "^diffusion" | cut -c1-150' \
    two_pass=tools/bench/ab/gns_cluster_two_pass.patch table=tools/bench/ab/timestep_param_table.patch 2>&1 | tee "$L/diffusion_ab.log"
  echo "diffusion A/B done at $SECONDS s"
fi
if left 90; then
  if patch -p1 -s <tools/bench/ab/gns_cluster_two_pass.patch && patch -p1 -s <tools/bench/ab/timestep_param_table.patch &&
     cmake --build build -j16 >>/tmp/build.log 2>&1; then
    timeout 90 ctest --test-dir build -j8 --output-on-failure -R Diffusion >"$L/ctest_diffusion_patched.log" 2>&1
    echo "patched diffusion ctest: $(grep -E 'tests passed' "$L/ctest_diffusion_patched.log")"
    grep -E "\((Failed|Timeout|SEGFAULT)|Failure|mismatch" "$L/ctest_diffusion_patched.log" | head -20
  else
    echo "the diffusion patches do not apply or build"; grep -E "error" /tmp/build.log | head
  fi
  patch -R -p1 -s <tools/bench/ab/timestep_param_table.patch; patch -R -p1 -s <tools/bench/ab/gns_cluster_two_pass.patch
  cmake --build build -j16 >>/tmp/build.log 2>&1
  echo "patched tests done at $SECONDS s"
fi
wait; left 40 && timeout 30 /tmp/ts 2>&1 | grep -vE "^$"
if left 100; then
  timeout 90 $PY tools/bench/vs_torch.py --reps 30 --no-compile --out /tmp/vs2 --only attention.decode >/tmp/vs2.log 2>&1
  grep -E "^attention|copy bandwidth|MISMATCH" /tmp/vs2.log | cut -c35-200
fi
# decode_mma_bench: V5 (the plugin's shape, split + merge kernels) against V7 (the last
# split block merges: one launch).
left 80 && timeout 70 /tmp/dm 2>&1 | grep -vE "^$" | tail -45
if left 70; then
  timeout $((UNTIL - SECONDS - 25)) ncu --clock-control none -k regex:decode --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    $PY tools/bench/ncu_case.py --calls 2 --only "attention.decode B=1 ctx=4096" >"$L/ncu_decode.log" 2>&1
  grep -E "decode_|Duration|DRAM Throughput|Memory Throughput|Warp Cycles|Achieved Occupancy|L2 Hit|Mem Busy|Max Bandwidth|spends" "$L/ncu_decode.log" | head -50
  # The same kernels with warm caches (as in a graph replay of one buffer set): durations only.
  left 40 && timeout 30 ncu --clock-control none --cache-control none -k regex:decode --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight $PY tools/bench/ncu_case.py --calls 2 --only "attention.decode B=1 ctx=4096" 2>&1 |
    grep -E "decode_|Duration|DRAM Throughput" | sed "s/^/warm: /"
fi
left 15 && taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_filter='Direct|Handle' 2>&1 | grep -E "median"
echo "done at $SECONDS s"
