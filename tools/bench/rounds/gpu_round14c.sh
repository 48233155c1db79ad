#!/usr/bin/env bash
# Issue 17, fourteenth round, third call (session 14): A/B of plugin builds, alternating,
# each step skipped once $SECONDS passes its deadline (UNTIL, default 420):
#  1. concat_mla_k without cache hints (concat_nohint.patch) and with plain stores only
#     (concat_store_plain.patch), vs_torch's concat_mla_k cases, two rounds;
#  2. group_norm_silu's cluster two-pass kernel capped at 4 or 5 blocks an SM by unused
#     shared memory (gns_occ4/5.patch: less held in L2 between the passes), two rounds;
#  3. rmsnorm triggering the next launch before its wait (rmsnorm_trigger_first.patch):
#     the decode-size peer rows with --pdl and a large shape, three rounds.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 420
gpu_round_start || exit 1
if left 300; then
  bash tools/bench/gpu_plugin_ab.sh attention 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only concat_mla_k --out /tmp/cab 2>&1 | grep -E "^attention" | cut -c1-110' \
    nohint=tools/bench/ab/concat_nohint.patch store_plain=tools/bench/ab/concat_store_plain.patch 2>&1 | tee "$L/concat_ab.log"
  echo "concat A/B done at $SECONDS s"
fi
if left 200; then
  bash tools/bench/gpu_plugin_ab.sh diffusion 2 '$PY tools/bench/vs_torch.py --reps 30 --no-compile --no-size-copy --only group_norm_silu --out /tmp/gab 2>&1 | grep -E "^diffusion" | cut -c1-110' \
    occ4=tools/bench/ab/gns_occ4.patch occ5=tools/bench/ab/gns_occ5.patch 2>&1 | tee "$L/gns_ab.log"
  echo "gns A/B done at $SECONDS s"
fi
if left 90; then
  bash tools/bench/gpu_plugin_ab.sh layernorm 3 'for c in "rmsnorm T=64,H=7168 --pdl" "rmsnorm T=16,H=4096 --pdl" "fused_add_rmsnorm T=64,H=7168 --pdl" "rmsnorm T=32768,H=4096" "rmsnorm T=32768,H=4096 --pdl"; do set -- $c; echo "$c: $(./build/tools/kreg bench layernorm.$1 --shape $2 --dtype bf16 --reps 200 $3 2>&1 | grep -oE "median [0-9.]+ us|rror.*")"; done' \
    trig=tools/bench/ab/rmsnorm_trigger_first.patch 2>&1 | tee "$L/rms_ab.log"
  echo "rmsnorm A/B done at $SECONDS s"
fi
echo "done at $SECONDS s"
