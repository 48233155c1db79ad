#!/usr/bin/env bash
# Issue 17, fourteenth round, second call (session 14), each step skipped once $SECONDS
# passes its deadline (UNTIL, default 480):
#  1. Release build (incremental on a warm machine);
#  2. A/B of plugin builds, two rounds: concat_mla_k with 2 and 4 vectors a thread
#     (tools/bench/ab/concat_items{2,4}.patch) against HEAD's one, vs_torch's concat_mla_k
#     cases (no torch.compile: its T=8192 figure comes from gpu_round14.sh's run);
#  3. A/B, three rounds: rmsnorm's decode sizes with four vectors a thread
#     (rmsnorm_small_four_items.patch), kreg bench plain and --pdl;
#  4. the attention GPU tests and memcheck of the concat sweep with concat_items4 applied.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 480
gpu_round_start || exit 1
if left 200; then
  bash tools/bench/gpu_plugin_ab.sh attention 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only concat_mla_k --out /tmp/cab 2>&1 | grep -E "^attention" | cut -c1-110' \
    items2=tools/bench/ab/concat_items2.patch items4=tools/bench/ab/concat_items4.patch 2>&1 | tee "$L/concat_ab.log"
  echo "concat A/B done at $SECONDS s"
fi
if left 120; then
  bash tools/bench/gpu_plugin_ab.sh layernorm 3 'for s in T=64,H=7168 T=16,H=4096 T=512,H=7168; do for p in "" --pdl; do echo "rmsnorm $s ${p:-plain}: $(./build/tools/kreg bench layernorm.rmsnorm --shape $s --dtype bf16 --reps 200 $p 2>&1 | grep -oE "median [0-9.]+ us|rror.*")"; done; done' \
    four=tools/bench/ab/rmsnorm_small_four_items.patch 2>&1 | tee "$L/rms_ab.log"
  echo "rmsnorm A/B done at $SECONDS s"
fi
if left 60 && patch -p1 -s <tools/bench/ab/concat_items4.patch && cmake --build build -j16 >>/tmp/build.log 2>&1; then
  gpu_ctest 40 AttentionGpu _c4
  gpu_memcheck attention_test 'AttentionGpu.LargeShapes:AttentionGpu.MatchTheCpu*:AttentionGpu.PdlChainsThrough*' 40 _c4
  patch -R -p1 -s <tools/bench/ab/concat_items4.patch
fi
echo "done at $SECONDS s"
