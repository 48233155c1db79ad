#!/usr/bin/env bash
# ctest external_plugin (tests/CMakeLists.txt): an out-of-tree plugin against an installed
# kreg, end to end.
#   1. (the ctest fixture external_plugin_prepare brought the CLI and libkreg up to date);
#   2. installs the build tree to a prefix of its own (cmake --install, components runtime
#      and development) and checks the package names no build or source path;
#   3. configures and builds tests/external against it (find_package(kreg), the same
#      generator and compiler), with nothing from the source tree on its include path;
#   4. writes a manifest for the built libkreg_example.so and runs the installed kreg on it
#      (validate, which loads the plugin in the installed kreg-probe; list, run) and the
#      example host program (call_example: values checked).
# Usage: run.sh CMAKE BUILD_DIR SOURCE_DIR GENERATOR CXX_COMPILER BUILD_TYPE LAUNCHER
#               SANITIZE DLPACK_DIR   (empty strings for what is unset)
set -euo pipefail
if [ $# -ne 9 ]; then
  echo "run.sh: expected 9 arguments, got $#" >&2
  exit 2
fi
cmake=$1 build=$2 src=$3 generator=$4 cxx=$5 build_type=$6 launcher=$7 sanitize=$8 dlpack_dir=$9
[ -f "$build/CMakeCache.txt" ] || { echo "run.sh: $build is not a CMake build folder" >&2; exit 2; }
[ -f "$src/tests/external/CMakeLists.txt" ] || { echo "run.sh: $src is not kreg's source tree" >&2; exit 2; }
# The manifest, plugin folder and overrides must be this test's own.
unset KREG_PLUGIN_DIR KREG_FORCE_BACKEND KREG_MANIFEST
# path-safety refuses a plugin or folder that group/others may write.
umask 022

# In the build tree, not $TMPDIR: a noexec /tmp could not dlopen the plugin. Private
# (path-safety), and removed at the start too, after a run that was killed.
work=$build/tests/external_plugin
rm -rf "$work"
mkdir -m 700 -p "$work"
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix ext=$work/build
step() { echo "== external_plugin (+${SECONDS}s): $*"; }
fail() {
  echo "external_plugin: FAILED: $*" >&2
  exit 1
}

# The fixture external_plugin_prepare built them; a clear message if it did not run.
for f in tools/kreg core/libkreg.so; do
  [ -e "$build/$f" ] || fail "$build/$f is not built (ctest runs external_plugin_prepare first)"
done

step "install $build to $prefix"
for component in runtime development; do
  "$cmake" --install "$build" --prefix "$prefix" --component "$component"
done
for f in bin/kreg libexec/kreg/kreg-probe include/kreg/abi.h include/kreg/plugin.hpp \
  include/kreg/registry.hpp include/kreg/device/workspace.cuh lib/cmake/kreg/kregConfig.cmake \
  lib/cmake/kreg/kregConfigVersion.cmake lib/cmake/kreg/kregTargets.cmake \
  lib/cmake/kreg/KregPlugin.cmake; do
  [ -f "$prefix/$f" ] || fail "the install has no $f"
done
# libkreg.so -> libkreg.so.X.Y.Z (SONAME); exactly one real file.
[ -L "$prefix/lib/libkreg.so" ] || fail "the install has no libkreg.so link"
soname_target=$(readlink "$prefix/lib/libkreg.so")
[ -f "$prefix/lib/$soname_target" ] || fail "libkreg.so points at a missing $soname_target"
ls "$prefix"/lib/libkreg.so.*.*.* >/dev/null 2>&1 || fail "the install has no versioned libkreg.so.X.Y.Z"
# The exported targets must work from anywhere: no path of this build or source tree, and
# none of libkreg's private dependencies.
# (The prefix lies inside the build tree, so look for the folders a leak would name.)
for pattern in "$src/core" "$build/core" "$build/tools"; do
  if grep -l -F "$pattern" "$prefix"/lib/cmake/kreg/*.cmake; then
    fail "the installed CMake package names '$pattern' (files above)"
  fi
done
# (IMPORTED_LINK_DEPENDENT_LIBRARIES may name yaml-cpp: only a hint for the linker's
# rpath-link, ignored when the name is no target.)
if grep -h INTERFACE_LINK_LIBRARIES "$prefix"/lib/cmake/kreg/kregTargets*.cmake | grep -i -e yaml -e boost; then
  fail "the exported targets require what libkreg links privately (lines above)"
fi

step "configure and build tests/external against $prefix"
args=(-S "$src/tests/external" -B "$ext" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix"
  -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
[ -n "$cxx" ] && args+=(-DCMAKE_CXX_COMPILER="$cxx")
[ -n "$launcher" ] && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
# The dlpack package the build tree used (find_dependency in kregConfig.cmake).
[ -n "$dlpack_dir" ] && args+=(-Ddlpack_DIR="$dlpack_dir")
if [ -n "$sanitize" ]; then
  # A sanitizer build's libkreg needs its runtime first in every program that loads it.
  flags="-fsanitize=$sanitize -fno-omit-frame-pointer"
  [[ $sanitize == *undefined* ]] && flags+=" -fno-sanitize-recover=undefined"
  args+=(-DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize"
    -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=$sanitize")
fi
"$cmake" "${args[@]}"
found=$(sed -n 's/^kreg_DIR:PATH=//p' "$ext/CMakeCache.txt")
[ "$found" = "$prefix/lib/cmake/kreg" ] || fail "find_package(kreg) found '$found', not the install"
"$cmake" --build "$ext"
# The headers come from the install only (Ninja: build.ninja, Makefiles: flags.make).
if grep -r -F --include=build.ninja --include=flags.make "$src/core/include" "$ext"; then
  fail "the external build compiles against kreg's source tree (lines above)"
fi
plugin=$ext/libkreg_example.so
[ -f "$plugin" ] || fail "kreg_add_plugin built no $plugin"

step "manifest for $plugin"
cat >"$work/registry.yaml" <<EOF
kreg_manifest: 1
plugin_dir: build
groups:
  - name: example
    library: libkreg_example.so
    version: "1.0.0"
    load: eager
EOF
kreg=$prefix/bin/kreg
manifest=$work/registry.yaml

step "kreg validate"
"$kreg" validate --manifest "$manifest" || fail "kreg validate failed on the example group"
# The installed kreg finds the installed kreg-probe (libexec/kreg, from lib/): the plugin was
# loaded there, not in a fork for want of it (a warning on library-loads would say so).
report=$(KREG_PROBE= "$kreg" validate --manifest "$manifest" --json) || fail "kreg validate --json failed"
if grep -q "no kreg-probe executable found" <<<"$report"; then
  fail "the installed kreg did not find the installed kreg-probe: $report"
fi

step "kreg list"
listing=$("$kreg" list --manifest "$manifest" --json) || fail "kreg list failed"
echo "$listing"
for op in example.axpy example.axmy; do
  grep -q "\"op\":\"$op\"" <<<"$listing" || fail "kreg list does not show $op"
done

step "kreg run"
"$kreg" run example.axpy --manifest "$manifest" --shape N=4096 --dtype f32 --backend cpu \
  --attr alpha=0.5 || fail "kreg run example.axpy failed"
"$kreg" run example.axmy --manifest "$manifest" --shape N=100 --dtype f64 --backend cpu ||
  fail "kreg run example.axmy failed"

step "call_example (kreg::core from the install)"
"$ext/call_example" "$manifest" || fail "call_example failed"

echo "external_plugin: passed"
