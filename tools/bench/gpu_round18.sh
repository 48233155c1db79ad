#!/usr/bin/env bash
# Issue 17, eighteenth round (prepared in session 16), each step skipped once $SECONDS passes
# its deadline (UNTIL, default 480):
#  1. Release build; the whole ctest suite (CTEST_R narrows it);
#  2. compute-sanitizer memcheck of the norms' GPU tests: the decode-size rmsnorm launch (a
#     vector a thread, a row a block, the PDL signal after the stores) adopted in session 16
#     from an H100 A/B, its PDL chain test at 64 x 7168 included;
#  3. the peer rows (kreg bench, graph chains at decode sizes; rmsnorm T=64 H=7168
#     with PDL was 2.44 us on the H100 against FlashInfer's 2.57 on the H200);
#  4. on an H200 (none lent in sessions 13-16): the targets missed only there (JIT odd
#     widths, norm_scale_shift [B,H]), the norms against torch.compile at decode sizes and
#     32768 rows, concat_mla_k and decode B=1 against torch.compile;
#  5. the dispatch benchmark on the card's host (last);
#  6. lplb.solve with S^-1 by Gauss-Jordan (tools/bench/ab/lplb_gj_inverse.patch) against
#     HEAD: lplb_demo's solve alternating, the lplb GPU tests and memcheck patched (after 2).
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 480
gpu_round_start || exit 1
gpu_ctest 180 "${CTEST_R:-}"
left 80 && gpu_memcheck layernorm_activation_test \
  'GpuKernels.Pdl*:GpuKernels.Misaligned*:GpuKernels.MatchTheCpuReferenceOverAShapeSweep' 70
# lplb.solve: S^-1 by Gauss-Jordan in warp 0's registers (r <= 8) instead of the Cholesky
# and two triangular solves (the corrector's solve becomes a product).
left 90 && gpu_lplb_variant lplb_gj_inverse
# The peer rows: the norms and silu at decode sizes first (rmsnorm T=64 H=7168 with PDL
# has no H200 figure yet), then align and topk_softmax.
gpu_peer_rows 60
if left 60 && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  gpu_h200_only_targets
  if left 60; then
    timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst \
      --only "layernorm.rmsnorm,concat_mla_k,attention.decode B=1 ctx=4096" 2>&1 |
      grep -E "^[a-z]+\." | cut -c1-150
  fi
fi
# The dispatch row on this card's host (pinned, three repetitions).
left 40 && timeout 30 taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true 2>&1 | grep -E "_median" | cut -c1-100
echo "done at $SECONDS s"
