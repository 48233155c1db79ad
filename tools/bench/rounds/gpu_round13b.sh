#!/usr/bin/env bash
# Issue 17, thirteenth round, second call (session 13): the three tests the first call's
# whole-suite run left unfinished at its 130 s limit (kvcache.store and set_mla_kv_buffer
# against the CPU reference, now built once a case, and python.kreg_torch), with the
# memory and concat_mla_k GPU tests; then, while time is left, the issue's peer rows with
# kreg bench on this card (plain, --pdl, --pdl --stable-inputs).
set -uo pipefail
source tools/bench/gpu_common.sh
gpu_round_frame 230
nvidia-smi --query-gpu=name --format=csv,noheader
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout $((UNTIL - SECONDS - 10)) ctest --test-dir build -j12 --output-on-failure \
  -R "KvcacheGpu|python.kreg_torch|GpuMemory|ConcatMla" >"$L/ctest.log" 2>&1
echo "ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed" "$L/ctest.log" | head -20
grep -E "KvcacheGpu.(Store|SetMla)Matches|python.kreg_torch" "$L/ctest.log" | grep -E "sec" | cut -c1-150
gpu_peer_rows 15
echo "done at $SECONDS s"
