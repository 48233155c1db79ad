#!/usr/bin/env bash
# Issue 17's H200 evidence, one device call per preset (docs/performance.md, "Fourth
# round"); each preset is a set of gpu_quick.sh knobs. Run from the repository root:
#   tools/bench/rounds/gpu_issue17.sh torch     # decode and the small shapes against torch, ncu of decode B=1
#   tools/bench/rounds/gpu_issue17.sh moe       # align_block_size and routing (kreg bench, plain and --pdl), vs_torch
#   tools/bench/rounds/gpu_issue17.sh norms     # JIT rmsnorm at odd widths, decode norms with and without PDL, dispatch
#   tools/bench/rounds/gpu_issue17.sh round5    # the whole suite, the gate/copy probe, decode norms, vs_torch of the
#                                        # kernels changed on 2026-12-02 ("Fifth round")
#   tools/bench/rounds/gpu_issue17.sh round6    # the sixth round's A/B runs: fused_qk_norm_rope and rmsnorm plugin
#                                        # builds (gpu_plugin_ab.sh), vs_torch output placement, gate_probe
# The variant benchmarks behind the fifth round's changes: tools/bench/variants/README.md.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
  torch)
    export CTEST_R="Attention|Diffusion|Kvcache|Memory|ConcatMla" JIT_H="4097" JIT_BE="cuda" JIT_RESOLVE=0
    export VS_ONLY="attention.decode,attention.rope,norm_scale_shift,timestep_embedding,set_mla_kv_buffer,copy_rows,concat_mla_k,residual_gate_add,kvcache.store"
    export NCU_ONLY="decode B=1 ctx=4096" NCU_K="decode" ;;
  moe)
    export CTEST_R="Moe|Harness" JIT_H="4096" JIT_BE="cuda" JIT_RESOLVE=0
    export VS_ONLY="align_block_size,topk_softmax,moe.route"
    export EXTRA='for s in "T=64,K=8,P=16640,B=260" "T=4096,K=8,P=48896,B=764" "T=32768,K=8,P=278272,B=4348"; do for p in "" --pdl; do
      printf "align %-30s %-6s " "$s" "${p:-plain}"; $k bench moe.align_block_size --shape $s --dtype i32 --attr num_experts=256 --attr block_size=64 --reps 200 $p 2>&1 | grep -E "median|rror"; done; done' ;;
  norms)
    export CTEST_R="Layernorm|Jit|GpuKernels" JIT_H="4097 4099 5121" JIT_BE="jit" JIT_RESOLVE=0
    export VS_ONLY="rmsnorm T=64,rmsnorm T=32768"
    export EXTRA='for a in "layernorm.rmsnorm --shape T=16,H=4096" "layernorm.rmsnorm --shape T=64,H=7168" "layernorm.fused_add_rmsnorm --shape T=64,H=7168"; do for p in "" --pdl; do
      printf "%-50s %-6s " "$a" "${p:-plain}"; $k bench $a --dtype bf16 --reps 200 $p 2>&1 | grep median; done; done
      taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>&1 | grep median' ;;
  round5)
    export CTEST_R="." CTEST_S=210 JIT_H="4096" JIT_BE="cuda" JIT_RESOLVE=0 VS_UNTIL=440
    export VS_ONLY="norm_scale_shift,group_norm_silu,fused_qk_norm_rope,kvcache.store,attention.rope,concat_mla_k,timestep_embedding"
    export EXTRA='timeout 70 $PY tools/bench/variants/gate_probe.py 2>&1 | tail -12
      for a in "layernorm.rmsnorm --shape T=64,H=7168" "layernorm.fused_add_rmsnorm --shape T=64,H=7168" "layernorm.rmsnorm --shape T=16,H=4096"; do for p in "" --pdl; do
      printf "%-50s %-6s " "$a" "${p:-plain}"; timeout 20 $k bench $a --dtype bf16 --reps 200 $p 2>&1 | grep -E "median|rror"; done; done' ;;
  round6)
    # The sixth round's A/B runs (docs/performance.md): plugin builds in one run, alternating.
    L=${OUT:-/tmp/out}; mkdir -p "$L"; PY=${PY:-/opt/torch/.venv/bin/python3}; export PY
    DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DPython3_EXECUTABLE=$PY "${dl[@]}" >"$L/configure.log" 2>&1 && cmake --build build -j16 >"$L/build.log" 2>&1 ||
      { tail -30 "$L/build.log"; exit 1; }
    bash "$here/gpu_plugin_ab.sh" attention 2 \
      '$PY tools/bench/vs_torch.py --reps 30 --no-compile --out /tmp/vs-ab --only "fused_qk_norm_rope T=32768" | grep ^attention' \
      param_freq=tools/bench/ab/qkn_param_freq.patch | tee "$L/qkn_ab.log"
    bash "$here/gpu_plugin_ab.sh" layernorm 2 'for a in "layernorm.rmsnorm --shape T=64,H=7168" "layernorm.fused_add_rmsnorm --shape T=64,H=7168" "layernorm.rmsnorm --shape T=16,H=4096"; do for p in "" --pdl; do
      printf "%-50s %-6s " "$a" "${p:-plain}"; timeout 20 ./build/tools/kreg bench $a --dtype bf16 --reps 200 $p | grep -E "median|rror"; done; done' \
      early_weight=tools/bench/ab/rmsnorm_early_weight.patch | tee "$L/rms_ab.log"
    export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
    for r in 1 2; do for f in "" --fixed-outputs; do
      $PY tools/bench/vs_torch.py --reps 30 --no-compile $f --out /tmp/vs-g --only "residual_gate_add B=16,copy_rows src 16384" | grep -E "^diffusion|^memory" | sed "s/^/r$r ${f:-fresh}: /"
    done; done | tee "$L/placement.log"
    timeout 80 $PY tools/bench/variants/gate_probe.py 2>&1 | tail -12 | tee "$L/gate_probe.log"
    exit 0 ;;
  *) echo "usage: $0 torch|moe|norms|round5|round6" >&2; exit 2 ;;
esac
exec bash "$here/gpu_quick.sh"
