#!/usr/bin/env bash
# The hardening evidence on a GPU machine (docs/hot-swap.md, docs/validation.md): Release build,
# whole suite, the host, watch mode rejecting a segfaulting and a wrong build while CUDA stress
# threads run (fork after CUDA), four benches, and an impossible allocation refused.
# Run from the repository root; .deps/ (../shared/device/prep-carry.sh) provides DLPack if missing.
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p $out
DL=$PWD/.deps/usr/lib/x86_64-linux-gnu/cmake/dlpack; dl=(); [ -d "$DL" ] && dl=(-Ddlpack_DIR=$DL)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "yaml-cpp: $(pkg-config --modversion yaml-cpp 2>/dev/null)"; command -v clang++ || echo "no clang"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${dl[@]}" >$out/configure.log 2>&1 || { tail -30 $out/configure.log; exit 1; }
cmake --build build -j16 >$out/build.log 2>&1 || { grep -E "error" $out/build.log | head -30; exit 1; }
ctest --test-dir build -j8 --output-on-failure >$out/ctest.log 2>&1
echo "ctest: $(grep -E 'tests passed' $out/ctest.log)"; grep -E "\((Failed|Timeout|SEGFAULT|Subprocess)" $out/ctest.log | head -20
echo "skipped: $(grep -c '(Skipped)' $out/ctest.log)"; grep -E "python.kreg" $out/ctest.log | tail -1
./build/tools/host/kreg-host 2>&1 | tail -4
cp build/plugins/libkreg_activation.so /tmp/good.so
./build/tools/host/kreg-host --watch --precheck-timeout 1 --stress 2 --duration 9 >$out/watch.log 2>&1 &
sleep 3; cp build/tests/plugins/libkreg_crash_segv_static.so build/plugins/.a.tmp && mv build/plugins/.a.tmp build/plugins/libkreg_activation.so
sleep 2; cp build/tests/plugins/libkreg_crash_hang_init.so build/plugins/.a.tmp && mv build/plugins/.a.tmp build/plugins/libkreg_activation.so
sleep 2; cp /tmp/good.so build/plugins/.a.tmp && mv build/plugins/.a.tmp build/plugins/libkreg_activation.so
wait; echo "watch rc=$?"; cut -c1-300 $out/watch.log | tail -8
k=./build/tools/kreg
for a in "layernorm.rmsnorm --shape T=32768,H=4096" "layernorm.rmsnorm --shape T=16,H=4096" "activation.silu_and_mul --shape T=32768,D=14336" "layernorm.fused_add_rmsnorm --shape T=32768,H=4096"; do $k bench $a --dtype bf16 --reps 200 2>&1 | tail -2; done
$k run layernorm.rmsnorm --shape T=99999999999,H=8; echo "rc=$?"
