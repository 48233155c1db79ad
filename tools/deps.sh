#!/usr/bin/env bash
# Installs what kreg needs to build on Debian 12 / Ubuntu 24.04 (apt), only what is
# missing. Runs apt as root directly, else through sudo. CUDA is optional: with nvcc at
# /usr/local/cuda the GPU kernels are built too, without it the CPU references only.
# torch (for kreg.torch and its tests) is installed where the distribution packages it
# (Debian 12: torch 1.13, CPU only); elsewhere those tests are skipped with a message.
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libboost-dev libyaml-cpp-dev libcli11-dev libdlpack-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      python3-dev pybind11-dev python3-numpy python3-pytest)
optional=(python3-torch libtorch-dev)
missing=()
for p in "${pkgs[@]}" "${optional[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
install=()
for p in "${missing[@]}"; do
  if [[ " ${optional[*]} " == *" $p "* ]] && ! apt-cache show "$p" >/dev/null 2>&1; then
    echo "kreg: $p is not packaged here: kreg.torch is not built (its tests skip)"
    continue
  fi
  install+=("$p")
done
[ ${#install[@]} -eq 0 ] && exit 0
echo "kreg: installing ${install[*]}"
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${install[@]}" >/dev/null
