#!/usr/bin/env bash
# The plugin SDK 1.2 evidence on a GPU machine (issue 13): Release build with the default
# architectures (80-real;90), the whole suite, what the loaded plugins claim and hold
# (capabilities from the build against the fatbinary), start-up with every group lazy,
# kreg validate on the default manifest, and the benches of docs/performance.md's table
# (unchanged within noise after the migration).
# Run from the repository root; .deps/ (../shared/device/prep-carry.sh) provides DLPack if missing.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p $out
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${dl[@]}" >$out/configure.log 2>&1 || { tail -30 $out/configure.log; exit 1; }
cmake --build build -j16 >$out/build.log 2>&1 || { grep -E "error" $out/build.log | head -30; exit 1; }
ctest --test-dir build -j8 --output-on-failure >$out/ctest.log 2>&1
echo "ctest: $(grep -E 'tests passed' $out/ctest.log)"; grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $out/ctest.log | head -20
echo "skipped: $(grep -c '(Skipped)' $out/ctest.log)"
k=./build/tools/kreg
$k info layernorm.rmsnorm 2>&1 | head -30
$k validate 2>&1 | tail -5
sed 's/load: eager/load: lazy/' registry.yaml > /tmp/lazy.yaml
for m in registry.yaml /tmp/lazy.yaml; do
  t0=$(date +%s%N); for i in $(seq 20); do KREG_PLUGIN_DIR=$PWD/build/plugins $k --manifest $m list >/dev/null 2>&1; done; t1=$(date +%s%N)
  echo "kreg list --manifest $m: $(( (t1 - t0) / 20000 )) us per run (mean of 20, incl. CUDA init where eager)"
done
for a in "layernorm.rmsnorm --shape T=32768,H=4096" "layernorm.fused_add_rmsnorm --shape T=32768,H=4096" \
         "activation.silu_and_mul --shape T=32768,D=14336" "layernorm.rmsnorm --shape T=16,H=4096" \
         "layernorm.fused_add_rmsnorm --shape T=16,H=4096" "activation.silu_and_mul --shape T=16,D=14336"; do
  $k bench $a --dtype bf16 --reps 200 2>&1 | tail -2
done
