#!/usr/bin/env bash
# The eighth round's last device call (docs/performance.md, "Eighth round"): Release build,
# the whole ctest suite (log in $OUT), the timestep variant bench, vs_torch on the small
# timestep cases (with torch.compile) and the decode cases (without), with the copy of
# each case's own bytes, and the dispatch bench. Compact output: only ctest.log is a file.
# Knobs: CTEST_R (ctest -R, default every test), CTEST_S, DECODE=0 (skip the decode cases).
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
(cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 ts_small.cu -o /tmp/ts) >/tmp/ts_build.log 2>&1 &
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DPython3_EXECUTABLE=$PY "${dl[@]}" >/tmp/configure.log 2>&1 || { tail -30 /tmp/configure.log; exit 1; }
cmake --build build -j16 >/tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -40; exit 1; }
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
timeout ${CTEST_S:-220} ctest --test-dir build -j10 --output-on-failure -R "${CTEST_R:-.}" >"$L/ctest.log" 2>&1
echo "ctest rc=$?: $(grep -E 'tests passed' "$L/ctest.log") at $SECONDS s"
grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed|Failure" "$L/ctest.log" | head -30
wait; timeout 30 /tmp/ts 2>&1 | grep -vE "^$"
timeout 90 $PY tools/bench/vs_torch.py --reps 50 --out /tmp/vs1 \
  --only "timestep_embedding N=2,timestep_embedding N=16" >/tmp/vs1.log 2>&1
grep -E "^diffusion|copy bandwidth|MISMATCH" /tmp/vs1.log | cut -c1-190
if [ "${DECODE:-1}" = 1 ]; then
  timeout 90 $PY tools/bench/vs_torch.py --reps 30 --no-compile --out /tmp/vs2 --only attention.decode >/tmp/vs2.log 2>&1
  grep -E "^attention|MISMATCH" /tmp/vs2.log | cut -c35-190
fi
taskset -c 3 ./build/tests/bench/kreg-bench-dispatch --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_filter='Direct|Handle' 2>&1 | grep -E "median"
echo "done at $SECONDS s"
