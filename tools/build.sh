#!/usr/bin/env bash
# Configures (once) and builds kreg into build/, where registry.yaml finds the plugins.
set -euo pipefail
cd "$(dirname "$0")/.."
"$PWD/tools/deps.sh"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja ${KREG_CMAKE_ARGS:-}
fi
cmake --build build -j"$(nproc)"
