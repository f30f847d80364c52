#!/usr/bin/env bash
# One GPU call: a subset build, then the branch candidates' tests and figures, most wanted first.
set -uo pipefail
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 WEFT_WAIT_TIMEOUT=20
B=build-gpu R=build-gpu/weftrun T=build-gpu/tests/weft_gpu_tests
mkdir -p "$OUT"
s() { echo "### $*" | tee -a "$OUT/summary.txt"; }
t0=$SECONDS
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DWEFT_GEMM_KERNELS=subset -DWEFT_GROUPED_KERNELS=all >"$OUT/configure.log" 2>&1
cmake --build $B -j 16 >"$OUT/build.log" 2>&1; s "build rc=$? $((SECONDS-t0)) s"; tail -n 5 "$OUT/build.log"
run() { local name=$1 lim=$2; shift 2; local t=$SECONDS; timeout "$lim" "$@" >"$OUT/$name.log" 2>&1; local rc=$?
  s "$name rc=$rc $((SECONDS-t)) s: $(grep -aE 'PASSED|FAILED' "$OUT/$name.log" | grep -a 'rank 0\|^\[' | tail -n 2 | tr '\n' ' ')"; }
run ep_bench 120 $R -n 1 --timeout 110 -- build-gpu/weft-bench ep --check --samples 30
grep -avE '^\[weft-bench\]' "$OUT/ep_bench.log" | tail -n 25
run ep_tests_w1 120 $R -n 1 --timeout 110 -- $T --gtest_filter='ExpertParallel*'
run ep_tests_w8 150 $R -n 8 --share-gpu --timeout 140 -- $T --gtest_filter='ExpertParallel*'
for n in 1 2 4 8; do sh=(); [ $n -gt 1 ] && sh=(--share-gpu)
  run moetp_w$n 150 $R -n $n "${sh[@]}" --timeout 140 -- $T --gtest_filter='MoeTp.*'; done
for r in 4/2 8/2 8/4; do n=${r%/*} nd=${r#*/}
  run internode_w${n}_n$nd 120 env WEFT_HEAP_BACKEND=nvshmem WEFT_VIRTUAL_NODES=$nd $R -n $n --share-gpu --timeout 110 -- \
    build-gpu/tests/weft_internode_tests --gtest_filter='-TwoLevelWaitTimeout.*'; done
run decode_tests_w1 150 $R -n 1 --timeout 140 -- $T --gtest_filter='FlashDecode.*:DistFlashDecode.*'
run decode_tests_w4 150 $R -n 4 --share-gpu --timeout 140 -- $T --gtest_filter='FlashDecode.*:DistFlashDecode.*'
run decode_sweep 200 $R -n 1 --timeout 190 -- build-gpu/weft-bench decode --sweep --check
grep -avE '^\[weft-bench\]' "$OUT/decode_sweep.log" | tail -n 40
s "total $((SECONDS-t0)) s"; cat "$OUT/summary.txt"
