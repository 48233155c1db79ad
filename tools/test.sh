#!/usr/bin/env bash
# README command 2: install dependencies, build, and run the whole test suite (ctest).
# GPU tests skip with a message where no CUDA device exists.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
