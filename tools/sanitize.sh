#!/usr/bin/env bash
# The hot-swap tests under ThreadSanitizer and AddressSanitizer (docs/hot-swap.md): two
# more build trees, build-tsan and build-asan (CPU-only, no benchmarks), each building only
# the core, the test plugins and reload_test, then running it. CI runs this after the
# normal test suite. Usage: tools/sanitize.sh [thread] [address]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
sanitizers=("$@")
[ ${#sanitizers[@]} -eq 0 ] && sanitizers=(thread address)
for san in "${sanitizers[@]}"; do
  case "$san" in
    thread) dir=build-tsan ;;
    address) dir=build-asan ;;
    *) echo "sanitize.sh: unknown sanitizer '$san' (thread or address)" >&2; exit 2 ;;
  esac
  start=$(date +%s)
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    cmake -S . -B "$dir" -G Ninja -DKREG_SANITIZE="$san" -DKREG_ENABLE_CUDA=OFF \
      -DKREG_BUILD_BENCHMARKS=OFF ${KREG_CMAKE_ARGS:-}
  fi
  cmake --build "$dir" -j"$(nproc)" --target reload_test
  # halt_on_error: any report fails the run. The suppressions file says why each entry is
  # there (none for code in this repository).
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tools/tsan.supp" \
  ASAN_OPTIONS="halt_on_error=1 detect_leaks=1" \
    "$dir/tests/unit/reload_test"
  echo "sanitize.sh: $san: reload_test clean ($(( $(date +%s) - start )) s with the build)"
done
