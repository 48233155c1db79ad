#!/usr/bin/env bash
# Issue 17, ninth round, the call after gpu_final8.sh on the same warm machine (its ./build
# is reused; built here otherwise). Every step behind a deadline (UNTIL, default 560 s):
#  1. diffusion A/B of plugin builds, two rounds: HEAD, tools/bench/ab/gns_cluster_two_pass.patch
#     and tools/bench/ab/timestep_param_table.patch, on vs_torch's group_norm_silu and small
#     timestep cases (no torch.compile: the A/B is kreg against kreg);
#  2. both patches applied to the tree, the diffusion plugin rebuilt, the diffusion GPU tests
#     (and the patches reverted and rebuilt);
#  3. ncu of attention.decode B=1 ctx 4096: speed of light, warp states, memory workload.
# Compact stdout; logs into $OUT (few files: the run returns at most 8).
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
PY=${PY:-/opt/torch/.venv/bin/python3}
UNTIL=${UNTIL:-560}
left() { [ $SECONDS -lt $((UNTIL - ${1:-0})) ]; }
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
if [ ! -f build/plugins/libkreg_diffusion.so ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DPython3_EXECUTABLE=$PY "${dl[@]}" >/tmp/configure.log 2>&1 || { tail -30 /tmp/configure.log; exit 1; }
fi
cmake --build build -j16 >/tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -40; exit 1; }
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
if left 200; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only "group_norm_silu,timestep_embedding N=2,timestep_embedding N=16" --out /tmp/dab 2>&1 | grep -E "^diffusion" | cut -c1-150' \
    two_pass=tools/bench/ab/gns_cluster_two_pass.patch table=tools/bench/ab/timestep_param_table.patch 2>&1 | tee "$L/diffusion_ab.log"
  echo "diffusion A/B done at $SECONDS s"
fi
if left 120; then
  if patch -p1 -s <tools/bench/ab/gns_cluster_two_pass.patch && patch -p1 -s <tools/bench/ab/timestep_param_table.patch &&
     cmake --build build -j16 >>/tmp/build.log 2>&1; then
    timeout 100 ctest --test-dir build -j8 --output-on-failure -R Diffusion >"$L/ctest_diffusion_patched.log" 2>&1
    echo "patched diffusion ctest: $(grep -E 'tests passed' "$L/ctest_diffusion_patched.log")"
    grep -E "\((Failed|Timeout|SEGFAULT)|Failure|mismatch" "$L/ctest_diffusion_patched.log" | head -20
  else
    echo "the diffusion patches do not apply or build"; grep -E "error" /tmp/build.log | head
  fi
  patch -R -p1 -s <tools/bench/ab/timestep_param_table.patch; patch -R -p1 -s <tools/bench/ab/gns_cluster_two_pass.patch
  echo "patched tests done at $SECONDS s"
fi
if left 60; then
  timeout $((UNTIL - SECONDS - 10)) ncu --clock-control none -k regex:decode --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    $PY tools/bench/ncu_case.py --calls 2 --only "attention.decode B=1 ctx=4096" >"$L/ncu_decode.log" 2>&1
  grep -E "decode_|Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Achieved Occupancy|Issued Warp|L2 Hit|Mem Busy|Max Bandwidth" "$L/ncu_decode.log" | head -60
fi
echo "done at $SECONDS s"
