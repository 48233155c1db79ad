#!/usr/bin/env bash
# Issue 17, eleventh round, one device call, each step skipped once $SECONDS passes its
# deadline (UNTIL, default 480):
#  (Ran at 64725c2, where attention.decode honoured KREG_LAUNCH_STABLE_INPUTS; that path was
#  reverted in d24bdea and is tools/bench/ab/decode_stable_inputs.patch.)
#  1. Release build; the GPU tests of the groups this round touched (attention: decode's
#     KREG_LAUNCH_STABLE_INPUTS path and its chain test; diffusion: group_norm_silu's chunks
#     of ~2048 vectors and the shapes at the new switch), the Python tests, tools_test;
#  2. compute-sanitizer memcheck of the stable-inputs chain test and of group_norm_silu's
#     shape sweep;
#  3. vs_torch's decode cases (graph replays of 64 calls), --pdl against --pdl
#     --stable-inputs (decode's history tiles issued before griddepcontrol.wait), alternating,
#     two rounds, and one plain round;
#  4. A/B of plugin builds: rmsnorm's weight prefetched into L1 before griddepcontrol.wait
#     under stable inputs (tools/bench/ab/rmsnorm_stable_weight_prefetch.patch, merged in
#     d24bdea after this run at 64725c2), kreg bench
#     --pdl --stable-inputs at decode sizes, three rounds;
#  5. A/B of plugin builds: HEAD against tools/bench/ab/gns_chunk_4096.patch (chunks of
#     ~4096 vectors), vs_torch's group_norm_silu cases, and the diffusion GPU tests with it;
#  6. vs_torch's group_norm_silu rows with torch.compile.
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
UNTIL=${UNTIL:-480}
left() { [ $SECONDS -lt $((UNTIL - ${1:-0})) ]; }
source tools/bench/gpu_common.sh
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout 150 ctest --test-dir build -j8 --output-on-failure -R "Attention|Diffusion|python|Tools" >"$L/ctest_touched.log" 2>&1
echo "touched ctest rc=$?: $(grep -E 'tests passed' "$L/ctest_touched.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT)|Failure|mismatch|differs" "$L/ctest_touched.log" | head -20
t=$(find build -name attention_test -type f -perm -u+x | head -1)
timeout ${MEMCHECK_S:-100} compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
  --gtest_filter='AttentionGpu.StableInputsChains*' >"$L/memcheck_decode.log" 2>&1
echo "memcheck decode rc=$? at $SECONDS s: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck_decode.log" | tail -3 | tr '\n' ' ')"
t=$(find build -name diffusion_test -type f -perm -u+x | head -1)
timeout 50 compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
  --gtest_filter='GpuDiffusionKernels.MatchTheCpuReferenceOverAShapeSweep' >"$L/memcheck_gns.log" 2>&1
echo "memcheck gns rc=$? at $SECONDS s: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck_gns.log" | tail -3 | tr '\n' ' ')"
# 3. Decode with PDL, with and without stable inputs (the decode cases of vs_torch that
# take graph replays and two that do not).
DEC="attention.decode B=1 ctx=4096,attention.decode B=16 ctx=1024,attention.decode B=1 ctx=32768,attention.decode B=64 ctx=4096"
vs_dec() { timeout 60 $PY tools/bench/vs_torch.py --reps 30 --no-compile --out /tmp/vsdec --only "$DEC" "$@" 2>&1 |
  grep -E "^attention|MISMATCH|Error" | cut -c1-150; }
for r in 1 2; do
  left 200 || break
  vs_dec --pdl | sed "s/^/r$r pdl: /"
  vs_dec --pdl --stable-inputs | sed "s/^/r$r pdl+stable: /"
done
left 170 && vs_dec | sed "s/^/plain: /"
echo "decode A/B done at $SECONDS s"
# rmsnorm's weight prefetched into L1 before griddepcontrol.wait under stable inputs
# (HEAD ignores the flag): decode-sized chains, 64-call graphs.
if left 140; then
  bash tools/bench/gpu_plugin_ab.sh layernorm 3 'for s in layernorm.rmsnorm:T=64,H=7168 layernorm.fused_add_rmsnorm:T=64,H=7168 layernorm.rmsnorm:T=16,H=4096; do ./build/tools/kreg bench ${s%%:*} --shape ${s#*:} --dtype bf16 --backend cuda --pdl --stable-inputs | grep -oE "^[a-z_.]+|median [0-9.]+ us" | tr "\n" " "; echo; done' \
    prefetch=tools/bench/ab/rmsnorm_stable_weight_prefetch.patch 2>&1 | tee "$L/rmsnorm_ab.log"
  echo "rmsnorm A/B done at $SECONDS s"
fi
if left 110; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only group_norm_silu --out /tmp/gab 2>&1 | grep -E "^diffusion" | cut -c1-110' \
    chunk4096=tools/bench/ab/gns_chunk_4096.patch 2>&1 | tee "$L/gns_ab.log"
  echo "A/B done at $SECONDS s"
fi
if left 70 && patch -p1 -s <tools/bench/ab/gns_chunk_4096.patch && cmake --build build -j16 >>/tmp/build.log 2>&1; then
  timeout 50 ctest --test-dir build -j8 --output-on-failure -R GpuDiffusion >/tmp/ctest_c4096.log 2>&1
  echo "chunk4096: diffusion ctest rc=$?: $(grep -E 'tests passed' /tmp/ctest_c4096.log) at $SECONDS s"
  grep -E "\((Failed|Timeout|SEGFAULT)|Failure|mismatch" /tmp/ctest_c4096.log | head -10
  patch -R -p1 -s <tools/bench/ab/gns_chunk_4096.patch
  cmake --build build -j16 >>/tmp/build.log 2>&1
fi
if left 40; then
  timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vsd --only group_norm_silu >/tmp/vsd.log 2>&1
  grep -E "^diffusion|copy bandwidth|MISMATCH" /tmp/vsd.log | cut -c1-200
fi
echo "done at $SECONDS s"
