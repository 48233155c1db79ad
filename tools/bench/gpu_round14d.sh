#!/usr/bin/env bash
# Issue 17, fourteenth round, fourth call (session 14): the adopted changes (concat_mla_k
# without cache hints; plain rmsnorm signalling launch_dependents before its wait) checked
# and measured against torch in one run, each step skipped once $SECONDS passes its
# deadline (UNTIL, default 300):
#  1. Release build; the attention, concat, layernorm/activation GPU tests and the JIT and
#     Python tests; memcheck of the PDL chain tests of both groups;
#  2. the norms' decode-size peer rows (plain, --pdl, --pdl --stable-inputs);
#  3. vs_torch (torch.compile included) for concat_mla_k and rmsnorm.
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 300
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout 100 ctest --test-dir build -j12 --output-on-failure -R "AttentionGpu|GpuConcatMlaK|GpuKernels|Jit|python" >"$L/ctest.log" 2>&1
echo "ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed" "$L/ctest.log" | head -20
for tc in "layernorm_activation_test GpuKernels.PdlChains*:GpuKernels.StableInputs*" "attention_test AttentionGpu.PdlChainsThrough*"; do
  set -- $tc
  left 60 || break
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/kernels/$1 \
    --gtest_filter="$2" >"$L/memcheck_$1.log" 2>&1
  echo "memcheck $2 rc=$?: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$L/memcheck_$1.log" | tail -2 | tr '\n' ' ')"
done
left 60 && gpu_peer_rows 60
if left 20; then
  timeout $((UNTIL - SECONDS - 5)) $PY tools/bench/vs_torch.py --reps 30 --out /tmp/vst \
    --only "concat_mla_k,layernorm.rmsnorm" >"$L/vs_torch.log" 2>&1
  grep -E "^[a-z]+\." "$L/vs_torch.log" | cut -c1-150
fi
echo "done at $SECONDS s"
