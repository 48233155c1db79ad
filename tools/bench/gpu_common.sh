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
