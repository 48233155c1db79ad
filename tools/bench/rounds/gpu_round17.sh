#!/usr/bin/env bash
# Issue 17, seventeenth round (session 16; ran at 1dc454e with UNTIL=540), each step skipped once $SECONDS passes its deadline
# (UNTIL, default 420):
#  1. Release build; the whole ctest suite (the harness's graph timing, now one function
#     shared by time_on_gpu and lplb_demo, and its two GPU tests);
#  2. lplb_demo plain and --pdl (the step timed through harness::time_graph_replays);
#  3. the peer rows through kreg bench's graph path (to compare with the fourteenth
#     round's numbers on the same kind of card: the timing's refactor must not move them);
#  4. ncu of lplb.solve's kernel (the demo LP): the pipes' utilization (FP64 among them),
#     the warp stall reasons and the issue rate: whether the six iterations are dependent
#     latency in one block (as docs/ops/lplb.md says) or the SM's FP64 issue throughput;
#  5. on an H200 (none lent in sessions 13-16 so far): the targets missed only there (JIT odd
#     widths, norm_scale_shift [B,H]), concat_mla_k and decode B=1 against torch.compile.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 420
gpu_round_start || exit 1
gpu_ctest 200 "${CTEST_R:-}"
demo=./build/tools/lplb_demo/lplb_demo
if left 40; then
  for f in "" "--pdl"; do
    echo "lplb_demo ${f:-plain}: $(timeout 30 $demo --device cuda $f 2>&1 | grep -E 'time per call|step|rror' | sed -E 's/time per call \(CUDA events, back-to-back launches\)//' | tr '\n' ' ')"
  done
fi
gpu_peer_rows 120
if left 60; then
  timeout 60 ncu --clock-control none -k regex:ipm_kernel -s 2 -c 1 --section ComputeWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats \
    --metrics sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp64.sum,smsp__inst_executed.sum,sm__cycles_elapsed.max \
    $demo --device cuda --reps 3 >"$L/ncu_lplb.log" 2>&1
  echo "ncu lplb rc=$?"
  grep -E "pipe_fp64|inst_executed|cycles_elapsed|Duration|Pipe|Stall|Issue|Warp Cycles|Ipc|FP64|fp64|Eligible|Active Warps|Executed Instructions|Registers" "$L/ncu_lplb.log" | head -50
fi
if left 60 && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  gpu_h200_only_targets
  if left 60; then
    timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst --only "concat_mla_k,attention.decode B=1 ctx=4096" 2>&1 | grep -E "^[a-z]+\." | cut -c1-150
  fi
fi
echo "done at $SECONDS s"
