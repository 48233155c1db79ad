#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (build-fuzz/: CPU-only, ASan+UBSan)
# and runs each for a while on a working copy of its seed corpus (tests/fuzz/corpus/<name>).
# Any crash, leak, hang (-timeout) or blow-up (-rss_limit_mb) fails the run; the input is
# left in build-fuzz/findings/<name>/ to become a fixture.
# Usage: tools/fuzz.sh [-t SECONDS_PER_TARGET] [-r RUNS] [name ...]   (default: 60 s, all)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60
runs=""
while getopts "t:r:" opt; do
  case "$opt" in
    t) seconds=$OPTARG ;;
    r) runs=$OPTARG ;;
    *) echo "usage: tools/fuzz.sh [-t SECONDS] [-r RUNS] [name ...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
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
status=0
for n in "${names[@]}"; do
  work=build-fuzz/corpus/$n findings=build-fuzz/findings/$n
  mkdir -p "$work" "$findings"
  seeds=tests/fuzz/corpus/$n
  [ -d "$seeds" ] || seeds=""
  limit=(-max_total_time="$seconds")
  [ -n "$runs" ] && limit=(-runs="$runs")
  log=build-fuzz/$n.log
  echo "tools/fuzz.sh: $n: ${runs:-$seconds s}"
  # -timeout: an input that takes over 2 s is a hang; -rss_limit_mb: a run that grows past
  # 2 GB is unbounded allocation; -malloc_limit_mb: so is any single allocation that large.
  if ! ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 allocator_may_return_null=0" \
       UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
       build-fuzz/tests/fuzz/kreg-fuzz-"$n" "${limit[@]}" -timeout=2 -rss_limit_mb=2048 \
         -malloc_limit_mb=1024 -print_final_stats=1 -artifact_prefix="$findings/" \
         "$work" $seeds >"$log" 2>&1; then
    echo "tools/fuzz.sh: $n: FINDING (see $log and $findings/)" >&2
    tail -40 "$log" >&2
    status=1
  fi
  grep -E "stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb" "$log" \
    | sed "s/^/  $n: /" || true
done
exit $status
