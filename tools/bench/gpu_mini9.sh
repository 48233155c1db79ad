#!/usr/bin/env bash
# The ninth round's shortest device call (little device time left): build, the diffusion tests on
# HEAD and with both diffusion patches of tools/bench/ab applied, the timestep variant bench.
source tools/bench/gpu_common.sh
(cd tools/bench/variants && nvcc -O3 -arch=sm_90 -std=c++17 ts_small.cu -o /tmp/ts) >/dev/null 2>&1 &
gpu_build || exit 1
echo "built $SECONDS"
ctest --test-dir build -j8 -R "Diffusion" --output-on-failure > $OUT/ctest_head.log 2>&1; echo "HEAD: $(grep 'tests passed' $OUT/ctest_head.log)"; grep -E "Failure|\(Failed" $OUT/ctest_head.log | head
patch -p1 -s < tools/bench/ab/gns_cluster_two_pass.patch && patch -p1 -s < tools/bench/ab/timestep_param_table.patch && cmake --build build -j16 >>/tmp/build.log 2>&1 && ctest --test-dir build -j8 -R "Diffusion" --output-on-failure > $OUT/ctest_patched.log 2>&1; echo "patched: $(grep 'tests passed' $OUT/ctest_patched.log) $SECONDS"; grep -E "Failure|\(Failed" $OUT/ctest_patched.log | head
wait; timeout 20 /tmp/ts 2>&1 | grep -v "^$" | head -30; echo "done $SECONDS"
