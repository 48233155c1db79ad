#!/usr/bin/env bash
# Issue 17, twelfth round (prepared in session 12, not yet run), one device call, each step
# skipped once $SECONDS passes its deadline (UNTIL, default 420):
#  1. Release build; the whole ctest suite (the last whole-suite GPU run was at 6fa2aa4);
#  2. A/B of plugin builds, two rounds: HEAD against tools/bench/ab/gns_threads_512.patch
#     (group_norm_silu's cluster two-pass blocks of 512 threads, 3 an SM: a chunk of ~2048
#     vectors in one batch of 4 a thread instead of two; ptxas: 40 registers, no spills),
#     vs_torch's group_norm_silu cases;
#  3. the diffusion GPU tests with the patch, then compute-sanitizer memcheck of the sweep;
#  4. kreg bench of decode behind the step's rope (--after), with and without --pdl.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 420
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout $((UNTIL - SECONDS - 150)) ctest --test-dir build -j10 --output-on-failure >"$L/ctest.log" 2>&1
echo "whole ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed" "$L/ctest.log" | head -20
if left 150; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only group_norm_silu --out /tmp/gab 2>&1 | grep -E "^diffusion" | cut -c1-110' \
    t512=tools/bench/ab/gns_threads_512.patch 2>&1 | tee "$L/gns_ab.log"
  echo "A/B done at $SECONDS s"
fi
if left 90 && patch -p1 -s <tools/bench/ab/gns_threads_512.patch && cmake --build build -j16 >>/tmp/build.log 2>&1; then
  timeout 50 ctest --test-dir build -j8 --output-on-failure -R GpuDiffusion >"$L/ctest_t512.log" 2>&1
  echo "t512: diffusion ctest rc=$?: $(grep -E 'tests passed' "$L/ctest_t512.log") at $SECONDS s"
  t=$(find build -name diffusion_test -type f -perm -u+x | head -1)
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
    --gtest_filter='GpuDiffusionKernels.MatchTheCpuReferenceOverAShapeSweep' >"$L/memcheck_t512.log" 2>&1
  echo "t512 memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$L/memcheck_t512.log")"
  patch -R -p1 -s <tools/bench/ab/gns_threads_512.patch
  cmake --build build -j16 >>/tmp/build.log 2>&1
fi
if left 30; then
  for f in "" "--pdl"; do
    echo "decode B=1 ctx 4096 after rope ${f:-plain}: $(./build/tools/kreg bench attention.decode --shape B=1,Hq=32,D=128,N=256,P=16,Hk=8,M=256 --dtype bf16 --backend cuda --attr scale=0.08838834764831845 $f --after attention.rope --after-shape T=1,Hq=32,D=128,Hk=8,P=4096,R=128 | grep -oE 'median.*GB/s')"
  done
fi
echo "done at $SECONDS s"
