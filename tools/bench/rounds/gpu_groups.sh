#!/usr/bin/env bash
# The GPU evidence for issues 15 (JIT) and 16 (five groups) on a GPU machine: a Release
# build against the machine's torch, the whole ctest suite (GPU tests of every group, the
# JIT tests), the JIT RMSNorm kernels next to the AOT ones at the layernorm benchmark's
# shapes and at odd widths (kreg bench, same run as the copy bandwidth), the cold and warm
# resolve of a JIT specialization (tools/bench/jit_resolve.py), and vs_torch.py on the new
# groups. Logs in $OUT (default /tmp/out), tarred as gpu-groups.tgz.
# Env: KREG_CTEST=false skips ctest; KREG_TORCH_ARGS narrows vs_torch.py.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p $out/logs
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
L=$out/logs
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=$PY "${dl[@]}" >$L/configure.log 2>&1 || { tail -30 $L/configure.log; exit 1; }
cmake --build build -j16 >$L/build.log 2>&1 || { grep -E "error" $L/build.log | head -40; exit 1; }
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
export KREG_JIT_CACHE=$out/jit-cache
if ${KREG_CTEST:-true}; then
  ctest --test-dir build -j8 --output-on-failure -E python >$L/ctest.log 2>&1
  echo "ctest (without python): $(grep -E 'tests passed' $L/ctest.log)"
  grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $L/ctest.log | head -30
  ctest --test-dir build -j4 --output-on-failure -R python >$L/ctest_python.log 2>&1
  echo "ctest python: $(grep -E 'tests passed' $L/ctest_python.log)"
  grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $L/ctest_python.log | head
fi
k=./build/tools/kreg
$k jit build --arch sm_90a --shape H=4096 --shape H=4097 --dtype bf16 2>&1 | tail -3 | tee $L/jit_build.log
: >$L/jit_bench.log
for op in rmsnorm fused_add_rmsnorm; do
  for h in 128 1024 2048 4096 5120 7168 8192 4097 4099 5121 3000; do
    for be in cuda jit; do
      $k bench layernorm.$op --shape T=32768,H=$h --dtype bf16 --backend $be --reps 200 2>&1 | grep -E "median|rror|disagree" | sed "s/^/$op H=$h $be: /" | tee -a $L/jit_bench.log
    done
  done
  for t in 16 64; do
    for be in cuda jit; do
      $k bench layernorm.$op --shape T=$t,H=7168 --dtype bf16 --backend $be --reps 200 --pdl 2>&1 | grep -E "median|rror" | sed "s/^/$op T=$t H=7168 pdl $be: /" | tee -a $L/jit_bench.log
    done
  done
done
$k bench layernorm.rmsnorm --shape T=32768,H=4097 --dtype f16 --backend jit --reps 200 2>&1 | grep median | sed "s/^/rmsnorm f16 H=4097 jit: /" | tee -a $L/jit_bench.log
$k bench layernorm.rmsnorm --shape T=32768,H=4097 --dtype f32 --backend jit --reps 200 2>&1 | grep median | sed "s/^/rmsnorm f32 H=4097 jit: /" | tee -a $L/jit_bench.log
$PY tools/bench/jit_resolve.py 2>&1 | tee $L/jit_resolve.log
$PY tools/bench/vs_torch.py --out $L/vs-torch --only ${KREG_GROUPS:-quantization,sampling,elementwise,embeddings,grammar,hadamard} ${KREG_TORCH_ARGS:-} >$L/vs_torch.log 2>&1
tail -n 60 $L/vs_torch.log
tar czf $out/gpu-groups.tgz -C $out logs
