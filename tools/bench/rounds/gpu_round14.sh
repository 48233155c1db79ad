#!/usr/bin/env bash
# Issue 17, fourteenth round (prepared in session 13, ran in session 14 at b0e8740 with
# UNTIL=540: docs/performance.md, "Thirteenth round"), one device call, each
# step skipped once $SECONDS passes its deadline (UNTIL, default 480):
#  1. Release build; the whole ctest suite (session 13's run stopped at 130 s with the three
#     longest tests still running; the kvcache ones now build each case once);
#  2. the decode-sized cases of the ops that took PDL in session 13 (kvcache.store and
#     set_mla_kv_buffer, memory.copy_rows, concat_mla_k, fused_qk_norm_rope, mrope,
#     moe.sum's neighbours), 64-call graph chains, plain against --pdl, two rounds;
#  3. the peer rows with kreg bench on this card (plain, --pdl, --pdl --stable-inputs);
#  4. ncu of AOT rmsnorm H=4096 against JIT H=4097 (the unexplained 5 points);
#  5. the dispatch benchmark on this host;
#  6. vs_torch (torch.compile included) on the still-missed torch rows, as time allows.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 480
gpu_round_start || exit 1
gpu_ctest 180
SMALL="kvcache.store T=16,kvcache.store T=64,kvcache.set_mla_kv_buffer n=16,kvcache.set_mla_kv_buffer n=64,memory.copy_rows src 64x4096,memory.copy_rows MLA KV 4096x576,attention.concat_mla_k T=16,attention.mrope_interleave S=16,attention.fused_qk_norm_rope T=16"
gpu_plain_vs_pdl "$SMALL" 200 60
left 110 && gpu_peer_rows 60
left 60 && gpu_ncu_rmsnorm_odd 25
if left 25; then
  timeout 20 taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true 2>&1 | grep -E "median" | cut -c1-100
fi
if left 40; then
  timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst \
    --only "attention.decode,norm_scale_shift,concat_mla_k,group_norm_silu" >"$L/vs_torch.log" 2>&1
  grep -E "^[a-z]+\." "$L/vs_torch.log" | cut -c1-150
fi
echo "done at $SECONDS s"
