#!/usr/bin/env bash
# README command 1: install dependencies, build, and run the host application on the
# default registry.yaml (GPU when there is one, else CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/build.sh
./build/tools/kreg validate --manifest registry.yaml
exec ./build/tools/host/kreg-host --manifest registry.yaml "$@"
