#!/usr/bin/env bash
# Issue 17, seventeenth round, second call (session 16; ran at eabacf6, SKIP_CTEST=1 UNTIL=500;
# the patches it names are merged or kept in tools/bench/ab/ since):
# rmsnorm T=64 H=7168 with PDL, the one peer row still behind (3.07 us against FlashInfer's
# 2.57 on the H200). A/B of plugin builds, alternating, two rounds, kreg bench graph chains:
#  - trigger_end: plain rmsnorm signals launch_dependents after its stores (FlashInfer's
#    placement) instead of at its start;
#  - fi_shape: at <= 512 rows, FlashInfer's launch (a vector a thread, one row a block: 896
#    threads x 64 blocks at H = 7168). The sixth round's one_item patch was not this shape:
#    it kept two rows a thread (32 blocks);
#  - fi_shape_end: both.
# Plain and --pdl, T=64 H=7168 and T=16 H=4096, and T=32768 H=4096 (the large-shape lead
# must hold: the patches change only calls of <= 512 rows and the PDL trigger).
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 420
gpu_round_start || exit 1
CTEST_R=${CTEST_R:-Layernorm|Pdl}; [ "${SKIP_CTEST:-0}" = 1 ] || gpu_ctest 60 "$CTEST_R"
left 120 && tools/bench/gpu_plugin_ab.sh layernorm 2 \
  'for s in T=64,H=7168 T=16,H=4096 T=32768,H=4096; do for f in "" --pdl; do echo "$s ${f:-plain} $(./build/tools/kreg bench layernorm.rmsnorm --shape $s --dtype bf16 --reps 200 $f 2>&1 | grep -oE "median [0-9.]+ us")"; done; done' \
  trigger_end=tools/bench/ab/rmsnorm_pdl_trigger_end.patch \
  fi_shape=tools/bench/ab/rmsnorm_flashinfer_shape.patch \
  fi_shape_end=tools/bench/ab/rmsnorm_flashinfer_shape_trigger_end.patch
echo "done at $SECONDS s"
