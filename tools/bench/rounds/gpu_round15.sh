#!/usr/bin/env bash
# Issue 17, fifteenth round (prepared in session 14 as its fourth call, which could not
# start; not yet run), each step skipped once $SECONDS passes its deadline (UNTIL, default
# 480):
#  1. Release build; the whole ctest suite (session 14's adopted changes, concat_mla_k
#     without cache hints and plain rmsnorm signalling launch_dependents before its wait,
#     were measured as A/B builds but their tests have not run on a GPU);
#  2. lplb.solve reading A with a cluster of 8 blocks (tools/bench/ab/lplb_cluster_read8.patch):
#     lplb_demo's solve time on HEAD and patched, the lplb GPU tests and memcheck patched;
#     then memcheck of the layernorm and attention PDL chain tests;
#  3. the norms' decode-size peer rows (--pdl); on an H200, the JIT odd widths and
#     norm_scale_shift [B,H] (the targets missed only there);
#  4. vs_torch (torch.compile included) for concat_mla_k;
#  5. the cluster of 4 (lplb_cluster_read4.patch), as step 2;
#  6. concat_mla_k with its former evict-first hints (concat_evict_first.patch) against HEAD,
#     two rounds: the hints were dropped on an H100's measurement; on an H200 this says
#     whether that holds there; and blocks of 128 or 512 threads (concat_threads128/512).
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 480
gpu_round_start || exit 1
gpu_ctest 180
demo=./build/tools/lplb_demo/lplb_demo
lplb_variant() {  # $1 = patch name
  for r in 1 2; do echo "HEAD r$r: $(timeout 20 $demo --device cuda 2>&1 | grep -oE 'solve [0-9.]+ us')"; done
  if patch -p1 -s <tools/bench/ab/$1.patch && cmake --build build -j16 --target kreg_lplb >>/tmp/build.log 2>&1; then
    gpu_ctest 40 LplbGpu "_$1"
    for r in 1 2; do echo "$1 r$r: $(timeout 20 $demo --device cuda 2>&1 | grep -oE 'solve: .*|solve [0-9.]+ us' | tr '\n' ' ')"; done
    left 40 && gpu_memcheck lplb_test 'LplbGpu.SolveMatchesTheCpu*:LplbGpu.SolveReachesTheExact*' 30 "_$1"
    patch -R -p1 -s <tools/bench/ab/$1.patch
  else
    echo "$1: does not apply or build"; grep -E "error" /tmp/build.log | head -5
  fi
  cmake --build build -j16 --target kreg_lplb >>/tmp/build.log 2>&1
}
left 60 && lplb_variant lplb_cluster_read8
for tc in "layernorm_activation_test GpuKernels.PdlChains*" "attention_test AttentionGpu.PdlChainsThrough*"; do
  set -- $tc
  left 60 || break
  gpu_memcheck "$1" "$2" 30
done
if left 40; then
  for a in "layernorm.rmsnorm --shape T=64,H=7168" "layernorm.rmsnorm --shape T=16,H=4096" "layernorm.fused_add_rmsnorm --shape T=64,H=7168"; do
    echo "$a --pdl: $(timeout 20 ./build/tools/kreg bench $a --dtype bf16 --reps 200 --pdl 2>&1 | grep -oE 'median [0-9.]+ us|rror.*')"
  done
fi
# On an H200, the two targets missed only there: JIT odd widths and norm_scale_shift [B,H].
if left 60 && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  gpu_h200_only_targets
fi
if left 40; then
  timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst --only "concat_mla_k" >"$L/vs_torch.log" 2>&1
  grep -E "^[a-z]+\." "$L/vs_torch.log" | cut -c1-150
fi
left 80 && lplb_variant lplb_cluster_read4
if left 80; then
  bash tools/bench/gpu_plugin_ab.sh attention 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only concat_mla_k --out /tmp/cab 2>&1 | grep -E "^attention" | cut -c1-110' \
    evict_first=tools/bench/ab/concat_evict_first.patch t128=tools/bench/ab/concat_threads128.patch \
    t512=tools/bench/ab/concat_threads512.patch 2>&1 | tee "$L/concat_ab.log"
fi
echo "done at $SECONDS s"
