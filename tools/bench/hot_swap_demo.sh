#!/usr/bin/env bash
# Hot swapping end to end, as a developer sees it: kreg-host runs with --watch and N
# stress threads (on the GPU when there is one) while this script
#   1. touches one layernorm kernel source and rebuilds the whole tree: only
#      libkreg_layernorm.so is recompiled and relinked (the build lines are printed), the
#      host swaps it in;
#   2. does the same for activation;
#   3. renames a truncated copy of the activation library into place: rejected, the
#      running generation keeps serving;
#   4. renames the good library back: swapped in.
# Usage: tools/bench/hot_swap_demo.sh [build-dir] [stress-threads] (after a build).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
threads=${2:-4}
plugins=$build/plugins
log=$(mktemp)
"$build/tools/host/kreg-host" --watch --stress "$threads" --duration 40 >"$log" 2>&1 &
host=$!
sleep 3

rebuild() {  # touch a source of the group, rebuild everything, show what ninja did
  local src=$1
  touch "$src"
  local t0=$(date +%s.%N)
  cmake --build "$build" 2>&1 | grep -E "Building|Linking" | sed 's/^/  build: /'
  echo "  rebuilt after touching $src in $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s"
  sleep 2
}
echo "== touch one layernorm source, rebuild the tree"
rebuild plugins/layernorm/rmsnorm.cu
echo "== touch one activation source, rebuild the tree"
rebuild plugins/activation/act_and_mul.cu
echo "== a truncated activation library is renamed into place"
good=$(mktemp)
cp "$plugins/libkreg_activation.so" "$good"
head -c 40000 "$good" >"$plugins/.partial.so"
chmod go-w "$plugins/.partial.so"
mv "$plugins/.partial.so" "$plugins/libkreg_activation.so"
sleep 2
echo "== the good library is renamed back"
cp "$good" "$plugins/.good.so"
chmod go-w "$plugins/.good.so"
mv "$plugins/.good.so" "$plugins/libkreg_activation.so"
rm -f "$good"
wait "$host" || true
echo "== kreg-host output"
cat "$log"
rm -f "$log"
