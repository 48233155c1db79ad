#!/usr/bin/env bash
# Installs what kreg needs to build on Debian 12 / Ubuntu 24.04 (apt), only what is
# missing. Runs apt as root directly, else through sudo. CUDA is optional: with nvcc at
# /usr/local/cuda the GPU kernels are built too, without it the CPU references only.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libboost-dev libyaml-cpp-dev libcli11-dev libdlpack-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      python3-dev pybind11-dev python3-numpy python3-pytest
      python3-torch libtorch-dev)  # kreg.torch: Debian's torch 1.13 (CPU; eager, no torch.compile)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "kreg: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
