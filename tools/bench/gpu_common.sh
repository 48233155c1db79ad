# Sourced by the device-run scripts (tools/bench/gpu_*.sh): PY (the Python with torch), the
# DLPack package that the GPU machine lacks (.deps/, ../shared/device/prep-carry.sh), and
# gpu_build: configure ./build once (Release, sm_90) and build it, printing only errors.
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack
dl=()
[ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
gpu_build() {
  if [ ! -f build/build.ninja ]; then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DPython3_EXECUTABLE="$PY" "${dl[@]}" >/tmp/configure.log 2>&1 || { tail -30 /tmp/configure.log; return 1; }
  fi
  cmake --build build -j16 >>/tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -40; return 1; }
}
# The one-call round scripts' frame: L (where logs go: $OUT on the device machine), UNTIL
# (the call's deadline in seconds, default $1) and `left N` (true while N seconds remain).
gpu_round_frame() {
  L=${OUT:-/tmp/out}; mkdir -p "$L"
  UNTIL=${UNTIL:-$1}
}
left() { [ $SECONDS -lt $((UNTIL - ${1:-0})) ]; }
# The round scripts' start: the card, the build and the environment the tools and tests read.
gpu_round_start() {
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
  gpu_build || return 1
  echo "built at $SECONDS s"
  export PYTHONPATH=$PWD/build/python KREG_PLUGIN_DIR=$PWD/build/plugins KREG_MANIFEST=$PWD/registry.yaml
}
# ctest bounded by $1 seconds, the tests matching $2 (all without it), log $L/ctest${3:-}.log:
# the summary line and the failures.
gpu_ctest() {
  local log=$L/ctest${3:-}.log
  timeout "$1" ctest --test-dir build -j12 --output-on-failure ${2:+-R "$2"} >"$log" 2>&1
  echo "ctest${2:+ -R $2} rc=$?: $(grep -E 'tests passed' "$log") at $SECONDS s"
  grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)|\*\*\*Failed" "$log" | head -20
}
# compute-sanitizer memcheck of test binary $1 (build/tests/kernels) with gtest filter $2,
# bounded by ${3:-40} s, log $L/memcheck_$1${4:-}.log.
gpu_memcheck() {
  local log=$L/memcheck_$1${4:-}.log
  timeout "${3:-40}" compute-sanitizer --tool memcheck --error-exitcode 3 "build/tests/kernels/$1" \
    --gtest_filter="$2" >"$log" 2>&1
  echo "memcheck $2 rc=$?: $(grep -E 'ERROR SUMMARY' "$log")"
}
# The issue's peer rows (PEERS.md's decode sizes and MoE rows) with kreg bench on the card
# at hand: the norms and silu plain, --pdl and --pdl --stable-inputs; align and
# topk_softmax. Each bench is bounded by 20 s; the rows stop once `left ${1:-15}` fails.
gpu_peer_rows() {
  local k=./build/tools/kreg a p s
  for a in "layernorm.rmsnorm --shape T=64,H=7168" "layernorm.rmsnorm --shape T=16,H=4096" \
    "layernorm.fused_add_rmsnorm --shape T=64,H=7168" "activation.silu_and_mul --shape T=16,D=2048"; do
    for p in "" "--pdl" "--pdl --stable-inputs"; do
      left "${1:-15}" || return 0
      printf "%-48s %-22s " "$a" "${p:-plain}"; timeout 20 $k bench $a --dtype bf16 --reps 200 $p 2>&1 | grep -oE "median [0-9.]+ us|rror.*"
    done
  done
  for s in "T=64,K=8,P=16640,B=260" "T=4096,K=8,P=48896,B=764" "T=32768,K=8,P=278272,B=4348"; do
    left "${1:-15}" || return 0
    printf "align %-30s " "$s"; timeout 20 $k bench moe.align_block_size --shape $s --dtype i32 --attr num_experts=256 --attr block_size=64 --reps 200 2>&1 | grep -oE "median [0-9.]+ us|rror.*"
  done
  for s in "T=64,E=256,K=8" "T=32768,E=256,K=8"; do
    left "${1:-15}" || return 0
    printf "topk_softmax renorm %-20s " "$s"; timeout 20 $k bench moe.topk_softmax --shape $s --dtype bf16 --attr renormalize=true --reps 200 2>&1 | grep -oE "median [0-9.]+ us|rror.*"
  done
}
# vs_torch's kreg rows for the cases matching $1 (comma-separated --only substrings),
# plain against --pdl (64-call graph chains at decode sizes), two rounds; a round starts
# only while `left ${2:-90}` holds. Each vs_torch call is bounded by ${3:-60} s.
gpu_plain_vs_pdl() {
  local r f
  for r in 1 2; do
    left "${2:-90}" || return 0
    for f in "" "--pdl"; do
      timeout "${3:-60}" $PY tools/bench/vs_torch.py --reps 30 --no-compile --out /tmp/vs-pdl --only "$1" $f 2>&1 |
        grep -E "^[a-z]+\.|MISMATCH|Error" | cut -c1-130 | sed "s/^/r$r ${f:-plain}: /"
    done
  done
}
# ncu of AOT rmsnorm at H = 4096 against JIT rmsnorm at H = 4097 (T = 32768 bf16): why the
# odd width trails (docs/performance.md). Speed of light, warp stalls, memory, occupancy;
# each profile bounded by ${1:-30} s, its log in $L.
gpu_ncu_rmsnorm_odd() {
  local pd=() c h be
  ncu --help 2>/dev/null | grep -q -- --print-details && pd=(--print-details all)
  for c in "4096 cuda" "4097 jit"; do
    read -r h be <<<"$c"
    timeout "${1:-30}" ncu --clock-control none -k regex:rmsnorm -s 6 -c 1 --section SpeedOfLight \
      --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy "${pd[@]}" \
      ./build/tools/kreg bench layernorm.rmsnorm --shape T=32768,H=$h --backend $be --dtype bf16 \
      --reps 3 >"$L/ncu_rms_$h.log" 2>&1
    echo "ncu H=$h $be rc=$?"
    grep -iE "Duration|DRAM Throughput|stall|Warp Cycles Per|Achieved Occ|Registers|L2 Hit|Mem Busy" \
      "$L/ncu_rms_$h.log" | head -40
  done
}
# The targets missed only on the H200 (docs/performance.md's issue 17 table): JIT rmsnorm
# at odd widths against the AOT kernel at H = 4096 (T = 32768 bf16, % of copy), and
# vs_torch's norm_scale_shift [B,H] case. Meant for an H200; prints on any card.
gpu_h200_only_targets() {
  local h be
  for h in 4096 4097 5121; do
    be=jit; [ $h = 4096 ] && be=cuda
    echo "rmsnorm T=32768 H=$h $be: $(timeout 30 ./build/tools/kreg bench layernorm.rmsnorm --shape T=32768,H=$h --backend $be --dtype bf16 --reps 100 2>&1 | grep -oE 'median.*of copy [0-9]+ GB/s')"
  done
  timeout 40 $PY tools/bench/vs_torch.py --reps 30 --no-compile --out /tmp/vsn --only "norm_scale_shift B=16" 2>&1 | grep -E "^diffusion" | cut -c1-150
}
# An lplb.solve variant (tools/bench/ab/$1.patch) against this tree in one run: lplb_demo's
# solve on HEAD, then patched (plugin rebuilt), alternating twice; the lplb GPU tests and
# memcheck of the solve tests patched; the patch is reverted and HEAD's plugin rebuilt.
gpu_lplb_variant() {
  local demo=./build/tools/lplb_demo/lplb_demo r
  if ! patch -p1 -s --dry-run <tools/bench/ab/$1.patch; then echo "$1: does not apply"; return 0; fi
  cp build/plugins/libkreg_lplb.so /tmp/lplb_head.so
  patch -p1 -s <tools/bench/ab/$1.patch
  if ! cmake --build build -j16 --target kreg_lplb >>/tmp/build.log 2>&1; then
    echo "$1: does not build"; grep -E "error" /tmp/build.log | head -5
  else
    cp build/plugins/libkreg_lplb.so /tmp/lplb_variant.so
    gpu_ctest 40 LplbGpu "_$1"
    for r in 1 2; do
      cp /tmp/lplb_head.so build/plugins/libkreg_lplb.so
      echo "HEAD r$r: $(timeout 20 $demo --device cuda 2>&1 | grep -oE 'after [0-9]+ iterations|z = [0-9.]+|solve [0-9.]+ us' | tr '\n' ' ')"
      cp /tmp/lplb_variant.so build/plugins/libkreg_lplb.so
      echo "$1 r$r: $(timeout 20 $demo --device cuda 2>&1 | grep -oE 'after [0-9]+ iterations|z = [0-9.]+|solve [0-9.]+ us' | tr '\n' ' ')"
    done
    left 40 && gpu_memcheck lplb_test 'LplbGpu.SolveMatchesTheCpu*:LplbGpu.SolveReachesTheExact*' 30 "_$1"
  fi
  patch -R -p1 -s <tools/bench/ab/$1.patch
  cp /tmp/lplb_head.so build/plugins/libkreg_lplb.so
}
