#!/usr/bin/env bash
# The shortest GPU evidence for issues 15 and 16 (one device call): Release build, the
# GPU tests of the JIT and the new groups, JIT vs AOT norms at odd and even widths, the
# JIT resolve times, vs_torch.py on the new groups. Logs straight into $OUT.
# Narrow it with CTEST_R (ctest -R pattern), JIT_H (widths), JIT_BE (backends), VS_ONLY
# (vs_torch.py --only),
# NCU_ONLY (cases profiled by ncu through ncu_case.py; empty: none), JIT_RESOLVE=0 and
# EXTRA (more shell commands after the JIT benches; $k is the kreg CLI), VS_UNTIL (second
# by which vs_torch.py is stopped, default 560) and VS_ARGS (more vs_torch.py options).
set -uo pipefail
# ncu without a kernel filter profiles every launch of the cases' setup too (torch's
# randperm, sorts): 20 passes each, minutes of device time for nothing.
if [ -n "${NCU_ONLY:-}" ] && [ -z "${NCU_K:-}" ]; then
  echo "gpu_quick.sh: NCU_ONLY needs NCU_K (a regex of kreg kernel names, e.g. group_quant)" >&2; exit 2
fi
L=${OUT:-/tmp/out}; mkdir -p $L
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DPython3_EXECUTABLE=$PY "${dl[@]}" >$L/configure.log 2>&1 || { tail -30 $L/configure.log; exit 1; }
cmake --build build -j16 >$L/build.log 2>&1 || { grep -E "error" $L/build.log | head -40; exit 1; }
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml KREG_JIT_CACHE=/tmp/jitc
timeout ${CTEST_S:-200} ctest --test-dir build -j8 --output-on-failure -R "${CTEST_R:-Gpu|Jit|Quantization|Sampling|Hadamard|Embeddings|Grammar|Elementwise|Layernorm|GpuKernels}" >$L/ctest.log 2>&1
echo "ctest: $(grep -E 'tests passed' $L/ctest.log) at $SECONDS s"; grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $L/ctest.log | head -30
k=./build/tools/kreg
for op in rmsnorm fused_add_rmsnorm; do for h in ${JIT_H:-4096 7168 4097 4099 5121}; do for be in ${JIT_BE:-cuda jit}; do
  timeout 30 $k bench layernorm.$op --shape T=32768,H=$h --dtype bf16 --backend $be --reps 100 2>&1 | grep -E "median|rror|disagree" | sed "s/^/$op H=$h $be: /" | tee -a $L/jit_bench.log
done; done; done
[ -n "${EXTRA:-}" ] && eval "$EXTRA" 2>&1 | tee $L/extra.log  # more commands, with $k = kreg
echo "bench at $SECONDS s"
[ "${JIT_RESOLVE:-1}" = 1 ] && timeout 60 $PY tools/bench/jit_resolve.py --runs 3 2>&1 | tee $L/jit_resolve.log
timeout $((${VS_UNTIL:-560} - SECONDS)) $PY tools/bench/vs_torch.py --reps 30 --out $L/vs --only "${VS_ONLY:-quantization,sampling,elementwise,embeddings,grammar}" ${VS_ARGS:-} >$L/vs_torch.log 2>&1
tail -n 45 $L/vs_torch.log
if [ -n "${NCU_ONLY:-}" ]; then
  # One profile per matching launch (kernels named by NCU_K); the whole report is in ncu.log.
  t=$((590 - SECONDS)); [ $t -gt 150 ] && t=150
  timeout $t ncu --clock-control none -k "regex:${NCU_K}" --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section MemoryWorkloadAnalysis $PY tools/bench/ncu_case.py --only "$NCU_ONLY" --calls 1 >$L/ncu.log 2>&1
  echo "ncu rc=$? at $SECONDS s"
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|Waves Per SM|stalled" $L/ncu.log | cut -c1-220 | head -80
fi
