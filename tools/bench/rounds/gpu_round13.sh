#!/usr/bin/env bash
# Issue 17, thirteenth round (session 13), one device call, each step skipped once $SECONDS
# passes its deadline (UNTIL, default 440):
#  1. the lplb variant bench compiled in the background; Release build; the whole ctest suite;
#  2. the diffusion group's decode-sized cases plain against --pdl (new); memcheck of the
#     session's five new PDL chain tests;
#  3. lplb_solve_bench: V3's (the plugin's) phase profile and the variants' times;
#  4. A/B of plugin builds, two rounds: HEAD against tools/bench/ab/gns_threads_512.patch
#     (group_norm_silu's cluster two-pass blocks of 512 threads), vs_torch's group_norm_silu
#     cases; the diffusion GPU tests and memcheck of the sweep with the patch;
#  5. the issue's peer rows with kreg bench on this card (plain, --pdl, --pdl --stable-inputs);
#  6. decode B=1 ctx 4096 behind the step's rope, plain and --pdl;
#  7. ncu of AOT rmsnorm H=4096 against JIT H=4097 (stall reasons);
#  8. the dispatch benchmark on this host; vs_torch (torch.compile included) on the issue's
#     torch table.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 440
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
(cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 lplb_solve_bench.cu -o /tmp/lsb >/tmp/lsb_build.log 2>&1) &
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout 130 ctest --test-dir build -j12 --output-on-failure >"$L/ctest.log" 2>&1
echo "whole ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed" "$L/ctest.log" | head -20
k=./build/tools/kreg
# memcheck of this session's PDL chain tests (diffusion, kvcache, memory, attention, moe.sum).
if left 120; then
  for tc in "diffusion_test GpuDiffusionKernels.PdlChains*" "kvcache_test KvcacheGpu.PdlChains*" \
    "memory_test GpuMemoryKernels.PdlChains*" "attention_test AttentionGpu.PdlChainsThrough*" \
    "moe_test MoeGpu.SumPdlChains*"; do
    set -- $tc
    left 120 || break
    timeout 45 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/kernels/$1 \
      --gtest_filter="$2" >"$L/memcheck_$1.log" 2>&1
    echo "memcheck $2 rc=$?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck_$1.log" | tail -2 | tr '\n' ' ')"
  done
fi
# The diffusion group with programmatic dependent launch (new this session): its decode-sized
# cases, 64-call graph chains, plain against --pdl, up to two rounds.
DIF="diffusion.timestep_embedding N=2,diffusion.timestep_embedding N=16,diffusion.norm_scale_shift B=1 S=16"
gpu_plain_vs_pdl "$DIF" 90 40
wait
if left 60 && [ -x /tmp/lsb ]; then
  timeout 50 /tmp/lsb 30 >"$L/lsb.log" 2>&1
  echo "lplb bench rc=$? at $SECONDS s"; grep -A14 "== V3 phases" "$L/lsb.log"; grep -E "^V3 |^V2 |ALL OK|FAIL" "$L/lsb.log" | head -20
else
  echo "lplb bench not run: $(tail -3 /tmp/lsb_build.log)"
fi
if left 150; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only group_norm_silu --out /tmp/gab 2>&1 | grep -E "^diffusion" | cut -c1-110' \
    t512=tools/bench/ab/gns_threads_512.patch 2>&1 | tee "$L/gns_ab.log"
  echo "A/B done at $SECONDS s"
fi
if left 90 && patch -p1 -s <tools/bench/ab/gns_threads_512.patch && cmake --build build -j16 >>/tmp/build.log 2>&1; then
  timeout 40 ctest --test-dir build -j8 --output-on-failure -R GpuDiffusion >"$L/ctest_t512.log" 2>&1
  echo "t512: diffusion ctest rc=$?: $(grep -E 'tests passed' "$L/ctest_t512.log") at $SECONDS s"
  t=$(find build -name diffusion_test -type f -perm -u+x | head -1)
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 3 "$t" \
    --gtest_filter='GpuDiffusionKernels.MatchTheCpuReferenceOverAShapeSweep' >"$L/memcheck_t512.log" 2>&1
  echo "t512 memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$L/memcheck_t512.log")"
  patch -R -p1 -s <tools/bench/ab/gns_threads_512.patch
  cmake --build build -j16 >>/tmp/build.log 2>&1
fi
left 100 && gpu_peer_rows 40
if left 40; then
  for f in "" "--pdl"; do
    echo "decode B=1 ctx 4096 after rope ${f:-plain}: $(timeout 20 $k bench attention.decode --shape B=1,Hq=32,D=128,N=256,P=16,Hk=8,M=256 --dtype bf16 --backend cuda --attr scale=0.08838834764831845 $f --after attention.rope --after-shape T=1,Hq=32,D=128,Hk=8,P=4096,R=128 | grep -oE 'median.*GB/s')"
  done
fi
left 100 && gpu_ncu_rmsnorm_odd 30
if left 60; then
  # Dispatch on this card's host (the issue asks for the H200 host's figure).
  timeout 40 taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E "median" | cut -c1-100
fi
if left 30; then
  timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst \
    --only "attention.decode,norm_scale_shift,timestep_embedding,set_mla_kv_buffer,concat_mla_k,group_norm_silu" >"$L/vs_torch.log" 2>&1
  grep -E "^[a-z]+\." "$L/vs_torch.log" | cut -c1-150
fi
echo "done at $SECONDS s"
