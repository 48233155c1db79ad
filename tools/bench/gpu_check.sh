#!/usr/bin/env bash
# The GPU evidence in one command, for a machine with an NVIDIA GPU (e.g. the H200):
# build (Release), the whole test suite (GPU tests included), the host application on
# the GPU, `kreg bench` at the issue's shapes against the device copy bandwidth,
# kreg from Python vs PyTorch eager / torch.compile (tools/bench/vs_torch.py), the Python
# call overhead next to the C++ launch floor (kreg-bench-launch), and the dispatch benchmark.
# Logs go to $OUT (or ./gpu-report). Extra CMake arguments: $KREG_CMAKE_ARGS.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/gpu-report}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release ${KREG_CMAKE_ARGS:-} >"$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
cmake --build build -j"$(nproc)" >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; exit 1; }

ctest --test-dir build -j8 --output-on-failure >"$out/ctest.log" 2>&1
echo "ctest: $(tail -n 3 "$out/ctest.log" | head -n 1)"
grep -E "Failed|SKIPPED|Skipped" "$out/ctest.log" | head -20

./build/tools/host/kreg-host | tee "$out/host.log" | tail -n 6
# Hot swapping on the GPU: the in-flight swap test's figures, then the developer loop.
./build/tests/unit/reload_gpu_test 2>&1 | grep -E "GPU hot swap|OK|FAILED"
tools/bench/hot_swap_demo.sh build 4 2>&1 | tee "$out/hot_swap.log" | grep -vE "^    " | tail -n 25

kreg=./build/tools/kreg
bench() { "$kreg" bench "$@" --reps 200 2>&1 | tee -a "$out/bench.log"; }
: >"$out/bench.log"
for dt in bf16; do
  bench layernorm.rmsnorm --shape T=32768,H=4096 --dtype $dt
  bench layernorm.fused_add_rmsnorm --shape T=32768,H=4096 --dtype $dt
  bench layernorm.gemma_rmsnorm --shape T=32768,H=4096 --dtype $dt
  bench activation.silu_and_mul --shape T=32768,D=14336 --dtype $dt
  bench activation.gelu_and_mul --shape T=32768,D=14336 --dtype $dt
  bench activation.gelu_tanh_and_mul --shape T=32768,D=14336 --dtype $dt
  bench layernorm.rmsnorm --shape T=16,H=4096 --dtype $dt
  bench layernorm.fused_add_rmsnorm --shape T=16,H=4096 --dtype $dt
  bench activation.silu_and_mul --shape T=16,D=14336 --dtype $dt
  bench activation.silu_and_mul --shape T=16,D=2048 --dtype $dt
done
bench layernorm.rmsnorm --shape T=32768,H=4096 --dtype f16
bench layernorm.rmsnorm --shape T=32768,H=4096 --dtype f32
bench layernorm.rmsnorm --shape T=32768,H=4097 --dtype bf16

# The Python the extension was built for (CMake prefers one that imports torch).
py=$(sed -n 's/^Python3_EXECUTABLE:[A-Z]*=//p' build/CMakeCache.txt 2>/dev/null)
py=${py:-python3}
if [ -d build/python/kreg ] && "$py" -c "import torch" 2>/dev/null; then
  # kreg from Python next to torch eager / torch.compile (checked first), and the Python
  # call overhead. KREG_TORCH_ARGS narrows it, e.g. "--only rmsnorm,silu_and_mul --reps 50".
  PYTHONPATH=build/python "$py" tools/bench/vs_torch.py --out "$out/vs-torch" ${KREG_TORCH_ARGS:-} 2>&1 |
    tee "$out/vs_torch.log" | tail -n 40
  # The C++ floor (an empty launch, the plugin entry, a handle) and the Python call, both on
  # one core, back to back: docs/python.md compares them.
  core=$(( $(nproc) - 1 ))
  taskset -c $core ./build/tests/bench/kreg-bench-launch --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true 2>&1 | tee "$out/launch.log" | grep -E "median"
  PYTHONPATH=build/python taskset -c $core "$py" tools/bench/py_overhead.py 2>&1 | tee "$out/py_overhead.log"
else
  echo "gpu_check: $py has no torch, or no kreg Python extension was built: skipping vs_torch.py" \
    "(configure with -DPython3_EXECUTABLE=<a python with torch>)"
fi
./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  2>&1 | tee "$out/dispatch.log" | grep -E "median|Run on|CPU"
