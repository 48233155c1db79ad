#!/usr/bin/env bash
# Programmatic dependent launch on a GPU machine (issue 17): build, the whole suite (the
# PDL chain test among the kernel tests), and kreg bench of the decode-sized norms and
# activations with and without --pdl (CUDA-graph replays of back-to-back calls, each
# behind the one before it), alternating, three times each.
# Run from the repository root; .deps/ (../shared/device/prep-carry.sh) provides DLPack if missing.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p $out
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKREG_BUILD_PYTHON=${KREG_BUILD_PYTHON:-OFF} "${dl[@]}" >$out/configure.log 2>&1 || { tail -30 $out/configure.log; exit 1; }
cmake --build build -j16 >$out/build.log 2>&1 || { grep -E "error" $out/build.log | head -30; exit 1; }
${KREG_CTEST:-true} && { ctest --test-dir build -j8 --output-on-failure >$out/ctest.log 2>&1; echo "ctest: $(grep -E 'tests passed' $out/ctest.log)"; grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $out/ctest.log | head -20; grep -A3 "PdlChains" $out/ctest.log | head -8; }
k=./build/tools/kreg
for a in "layernorm.rmsnorm --shape T=16,H=4096" "layernorm.rmsnorm --shape T=64,H=7168" \
         "layernorm.fused_add_rmsnorm --shape T=64,H=7168" "layernorm.fused_add_rmsnorm --shape T=16,H=4096" \
         "activation.silu_and_mul --shape T=16,D=2048" "activation.silu_and_mul --shape T=64,D=14336" \
         "layernorm.rmsnorm --shape T=32768,H=4096" "activation.silu_and_mul --shape T=32768,D=14336"; do
  for r in 1 2 3; do
    for p in "" --pdl; do
      printf "%-55s %-6s " "$a" "${p:-plain}"; $k bench $a --dtype bf16 --reps 200 $p 2>&1 | grep median
    done
  done
done | tee $out/pdl_bench.txt
tar -C $out -czf $out/logs.tgz --remove-files $(cd $out && ls *.log)
