#!/usr/bin/env bash
# A/B of plugin builds in one device run: builds this tree (variant "HEAD") and, for each
# NAME=PATCH, a copy of it with the patch applied (patch -p1, from the repository root),
# of which only the group's plugin is built; each variant's plugin folder is HEAD's with
# that one library replaced. Then runs CMD once per variant per round, alternating (HEAD
# first), with KREG_PLUGIN_DIR pointing at the variant's folder; each output line is
# prefixed with the round and the variant. Two builds measured in one run, alternating,
# are comparable; numbers from different runs often are not (docs/performance.md, sixth
# round).
#   tools/bench/gpu_plugin_ab.sh GROUP ROUNDS 'CMD' NAME=PATCH...
#   tools/bench/gpu_plugin_ab.sh layernorm 2 \
#     './build/tools/kreg bench layernorm.rmsnorm --shape T=64,H=7168 --dtype bf16 --pdl' \
#     one_item=tools/bench/ab/rmsnorm_small_one_item.patch
# CMD runs from the repository root with PYTHONPATH and KREG_MANIFEST set; $PY is the
# Python with torch. Expects ./build to be configured or configurable (GPU machine: PY and
# .deps as in gpu_common.sh; AB_CMAKE_ARGS adds configure options). Variant trees go to
# ${AB_TMP:-/tmp/kreg-ab}.
set -uo pipefail
[ $# -ge 4 ] || { sed -n 2,19p "$0" >&2; exit 2; }
group=$1 rounds=$2 cmd=$3; shift 3
root=$PWD
tmp=${AB_TMP:-/tmp/kreg-ab}
PY=${PY:-/opt/torch/.venv/bin/python3}
DL=$root/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DPython3_EXECUTABLE=$PY "${dl[@]}" ${AB_CMAKE_ARGS:-})
if [ ! -f build/plugins/libkreg_$group.so ]; then
  cmake -S . -B build "${cfg[@]}" >/dev/null && cmake --build build -j"$(nproc)" >/dev/null ||
    { echo "gpu_plugin_ab: the HEAD build failed" >&2; exit 1; }
fi
names=(HEAD); dirs=("$root/build/plugins")
for spec in "$@"; do
  name=${spec%%=*} patch=$(realpath "${spec#*=}")
  src=$tmp/src-$name bld=$tmp/build-$name plug=$tmp/plugins-$name
  rm -rf "$src" "$plug" && mkdir -p "$src" "$plug"
  tar --exclude=./build --exclude='./build-*' -cf - . | tar -C "$src" -xf -
  if ! (cd "$src" && patch -p1 -s <"$patch" && cmake -S . -B "$bld" "${cfg[@]}" -DKREG_BUILD_TESTS=OFF \
          -DKREG_BUILD_BENCHMARKS=OFF >/dev/null && cmake --build "$bld" -j"$(nproc)" --target kreg_$group >/dev/null); then
    echo "gpu_plugin_ab: variant $name does not build" >&2; exit 1
  fi
  cp "$root"/build/plugins/*.so "$plug"/ && cp "$bld/plugins/libkreg_$group.so" "$plug"/
  cmp -s "$plug/libkreg_$group.so" "$root/build/plugins/libkreg_$group.so" &&
    echo "gpu_plugin_ab: warning: variant $name's library equals HEAD's" >&2
  names+=("$name"); dirs+=("$plug")
done
export PYTHONPATH=$root/build/python KREG_MANIFEST=$root/registry.yaml PY
for ((r = 1; r <= rounds; r++)); do
  for i in "${!names[@]}"; do
    KREG_PLUGIN_DIR=${dirs[$i]} bash -c "$cmd" 2>&1 | sed "s/^/r$r ${names[$i]}: /"
  done
done
