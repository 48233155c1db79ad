#!/usr/bin/env bash
# Issue 17, eleventh round, second call: attention.decode's early history reads
# (tools/bench/ab/decode_stable_inputs.patch) measured behind a producer, as a model step
# runs it: kreg bench --after attention.rope (the step's rope of q, one token a sequence),
# --pdl against --pdl --stable-inputs, HEAD (which ignores the flag: the noise floor) against
# the patch, three rounds alternating; B=1 ctx 4096 also without a producer (decode after
# decode). Then, time allowing (UNTIL, default 330), the Python tests.
set -uo pipefail
L=${OUT:-/tmp/out}; mkdir -p "$L"
UNTIL=${UNTIL:-330}
source tools/bench/gpu_common.sh
gpu_build || exit 1
echo "built at $SECONDS s"
export PYTHONPATH=$PWD/build/python KREG_MANIFEST=$PWD/registry.yaml
bash tools/bench/gpu_plugin_ab.sh attention 3 '
for c in 1:256:256 16:1024:64 8:4096:512; do
  IFS=: read b n m <<<"$c"
  for f in "--pdl" "--pdl --stable-inputs"; do
    r=$(./build/tools/kreg bench attention.decode --shape B=$b,Hq=32,D=128,N=$n,P=16,Hk=8,M=$m --dtype bf16 --backend cuda --attr scale=0.08838834764831845 $f --after attention.rope --after-shape T=$b,Hq=32,D=128,Hk=8,P=4096,R=128 | grep -oE "median [0-9.]+ us a pair|alone [0-9.]+ us|share [0-9.]+ us" | tr "\n" " ")
    echo "B=$b ctx=$((m * 16)) after rope $f: $r"
  done
done
for f in "--pdl" "--pdl --stable-inputs"; do
  echo "B=1 ctx=4096 after decode $f: $(./build/tools/kreg bench attention.decode --shape B=1,Hq=32,D=128,N=256,P=16,Hk=8,M=256 --dtype bf16 --backend cuda --attr scale=0.08838834764831845 $f | grep -oE "median [0-9.]+ us")"
done' stable=tools/bench/ab/decode_stable_inputs.patch 2>&1 | tee "$L/decode_after_rope.log"
echo "A/B done at $SECONDS s"
if [ $SECONDS -lt $((UNTIL - 110)) ]; then
  timeout $((UNTIL - SECONDS - 5)) ctest --test-dir build --output-on-failure -R python >"$L/ctest_python.log" 2>&1
  echo "python ctest rc=$?: $(grep -E 'tests passed' "$L/ctest_python.log") at $SECONDS s"
  grep -E "FAILED|Error|failed" "$L/ctest_python.log" | head -10
fi
echo "done at $SECONDS s"
