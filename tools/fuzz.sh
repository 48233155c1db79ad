#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (build-fuzz/: CPU-only, ASan+UBSan)
# and runs each for a while on a working copy of its seed corpus (tests/fuzz/corpus/<name>).
# Any crash, leak, hang (-timeout) or blow-up (-rss_limit_mb) fails the run; the input is
# left in build-fuzz/findings/<name>/ to become a fixture.
# Usage: tools/fuzz.sh [-t SECONDS_PER_TARGET] [-r RUNS] [-j WORKERS] [-p TARGETS] [name ...]
#   (default: 60 s, all targets, one worker, one target at a time; -j N runs N workers per
#   target on one corpus and sums their counts: the long campaigns before a release; -p N runs
#   N targets at once, each on one core: CI's smoke run on its 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
runs=""
workers=1
targets_at_once=1
while getopts "t:r:j:p:" opt; do
  case "$opt" in
    t) seconds=$OPTARG ;;
    r) runs=$OPTARG ;;
    j) workers=$OPTARG ;;
    p) targets_at_once=$OPTARG ;;
    *) echo "usage: tools/fuzz.sh [-t SECONDS] [-r RUNS] [-j WORKERS] [-p TARGETS] [name ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
for v in "$seconds" "$workers" "$targets_at_once" ${runs:+"$runs"}; do
  [[ "$v" =~ ^[1-9][0-9]{0,6}$ ]] || { echo "tools/fuzz.sh: '$v' is not a count from 1 to 9999999" >&2; exit 2; }
done
if ! command -v clang++ >/dev/null; then
  echo "tools/fuzz.sh: clang++ not found (apt-get install clang); the fuzz targets need libFuzzer" >&2
  exit 2
fi
if [ ! -f build-fuzz/CMakeCache.txt ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DKREG_BUILD_FUZZERS=ON \
    -DKREG_ENABLE_CUDA=OFF -DKREG_BUILD_TESTS=OFF -DKREG_BUILD_BENCHMARKS=OFF \
    -DKREG_BUILD_PYTHON=OFF ${KREG_CMAKE_ARGS:-} >/dev/null
fi
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cpp; do
    n=$(basename "$f" _fuzz.cpp)
    names+=("$n")
  done
fi
cmake --build build-fuzz -j"$(nproc)" --target $(printf 'kreg-fuzz-%s ' "${names[@]}")
# One target: its run, then its summary line; a finding or a failed run leaves the target's
# name in build-fuzz/failed/ (the targets may run in parallel subshells).
run_target() {
  local n=$1
  local work=build-fuzz/corpus/$n findings=build-fuzz/findings/$n
  mkdir -p "$work" "$findings"
  local seeds=tests/fuzz/corpus/$n
  [ -d "$seeds" ] || seeds=""
  local limit=(-max_total_time="$seconds")
  [ -n "$runs" ] && limit=(-runs="$runs")
  local log=$PWD/build-fuzz/$n.log
  local parallel=()
  [ "$workers" -gt 1 ] && parallel=(-jobs="$workers" -workers="$workers")
  echo "tools/fuzz.sh: $n: ${runs:-$seconds s} x $workers worker(s)"
  rm -f build-fuzz/$n-workers/fuzz-*.log; mkdir -p build-fuzz/$n-workers
  # -timeout: an input that takes over 2 s is a hang; -rss_limit_mb: a run that grows past
  # 2 GB is unbounded allocation; -malloc_limit_mb: so is any single allocation that large.
  # With -jobs, each worker logs to fuzz-<i>.log in the current folder.
  if ! (cd build-fuzz/$n-workers &&
        ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 allocator_may_return_null=0" \
        UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
        ../tests/fuzz/kreg-fuzz-"$n" "${limit[@]}" "${parallel[@]}" -timeout=2 -rss_limit_mb=2048 \
          -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$PWD/../findings/$n/" \
          "$PWD/../corpus/$n" ${seeds:+"$OLDPWD/$seeds"}) >"$log" 2>&1; then
    echo "tools/fuzz.sh: $n: FINDING (see $log, build-fuzz/$n-workers/ and $findings/)" >&2
    tail -40 "$log" >&2
    touch "build-fuzz/failed/$n"
  fi
  [ "$(ls "$findings" | wc -l)" -gt 0 ] && { echo "tools/fuzz.sh: $n: findings in $findings/" >&2; touch "build-fuzz/failed/$n"; }
  # (the worker logs exist only with -j; under pipefail a failing cat would end the script)
  { cat "$log"; cat build-fuzz/$n-workers/fuzz-*.log 2>/dev/null || true; } | awk -v n="$n" '
    /stat::number_of_executed_units/ {e += $2}
    /stat::average_exec_per_sec/ {r += $2}
    /stat::peak_rss_mb/ {if ($2 > m) m = $2}
    END {printf "  %s: %d executions, %d exec/s (all workers), peak RSS %d MB\n", n, e, r, m}'
}
rm -rf build-fuzz/failed; mkdir -p build-fuzz/failed
for n in "${names[@]}"; do
  if [ "$targets_at_once" -gt 1 ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$targets_at_once" ]; do wait -n || true; done
    run_target "$n" &
  else
    run_target "$n"
  fi
done
wait
failed=$(ls build-fuzz/failed)
[ -z "$failed" ] || { echo "tools/fuzz.sh: findings or failed runs:" $failed >&2; exit 1; }
