#!/usr/bin/env bash
# Issue 17, sixteenth round (session 15), each step skipped once $SECONDS passes its deadline
# (UNTIL, default 420):
#  1. Release build; the whole ctest suite (lplb.solve's cluster read of A as adopted, the
#     lplb group's programmatic dependent launch and its new chain test, the sampling
#     plugin's occupancy query through device::max_active_clusters);
#  2. lplb_demo plain and --pdl, two rounds each: per-op times and the whole step as CUDA
#     graph replays; compute-sanitizer memcheck of every lplb GPU test;
#  3. ncu of group_norm_silu N=16 C=512 64x64 (vs_torch's case): DRAM bytes read and
#     written against the tensors' 134 MB, L2 hit rate, duration, DRAM throughput: whether
#     the 76% of copy is bytes (pass 2 missing L2) or time between them;
#  4. on an H200 (none lent in sessions 13-15): the targets missed only there (JIT odd
#     widths, norm_scale_shift [B,H]), the peer rows, concat_mla_k against
#     torch.compile.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 420
gpu_round_start || exit 1
gpu_ctest 180 "${CTEST_R:-}"  # CTEST_R: a regex for a short call (all tests without it)
demo=./build/tools/lplb_demo/lplb_demo
if left 40; then
  for r in 1 2; do
    for f in "" "--pdl"; do
      echo "lplb_demo r$r ${f:-plain}: $(timeout 30 $demo --device cuda $f 2>&1 | grep -E 'time per call|step|rror' | sed -E 's/time per call \(CUDA events, back-to-back launches\)//' | tr '\n' ' ')"
    done
  done
fi
left 60 && gpu_memcheck lplb_test 'LplbGpu.*' 50
if left 60; then
  timeout 60 ncu --clock-control none -k regex:group_norm_silu -s 2 -c 1 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_srcunit_tex_op_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
    $PY tools/bench/ncu_case.py --only "group_norm_silu N=16 C=512" >"$L/ncu_gns.log" 2>&1
  echo "ncu gns rc=$?"
  grep -E "group_norm_silu|duration|bytes|hit_rate|throughput|sectors|warps_active" "$L/ncu_gns.log" | head -20
fi
if left 60 && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  gpu_h200_only_targets
  gpu_peer_rows 100
  if left 60; then
    timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst --only "concat_mla_k,attention.decode B=1 ctx=4096" 2>&1 | grep -E "^[a-z]+\." | cut -c1-150
  fi
fi
echo "done at $SECONDS s"
