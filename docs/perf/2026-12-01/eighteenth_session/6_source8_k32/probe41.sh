#!/bin/bash
# 18th session call 6 (1 x H200), branch source-k32: all 8 source sub-tiles in flight with K-blocks of 32
# (6 mainloop stages) against the 4-of-8 TMA source epilogue (K-blocks of 64, 4 stages), B [K, N]:
# GPU tests, then the GEMMs alone, 2 rounds.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
O=$OUT; t0=$SECONDS
OUT=$O/s bash scripts/gpu_session.sh build > $O/session.log 2>&1
grep -E "build:" $O/session.log | tail -1
B=build-gpu
for n in 1; do
  $B/weftrun -n $n --timeout 150 -- $B/tests/weft_gpu_tests > $O/tests_w$n.log 2>&1
  echo "tests, world $n: $(grep -E '^\[  (PASSED|FAILED) ' $O/tests_w$n.log | tr '\n' ' ') at $((SECONDS-t0)) s"
done
grep -E "FAILED|Failure" -A3 $O/tests_w1.log | head -20; grep -E "^\[ +(OK|FAILED) +\] Gemm.HookedConfigurationsWait" $O/tests_w1.log
g() { $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout kn --samples 15 --shapes '1024,8192,4096;2048,8192,4096;4096,8192,4096' "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ "; }
g | sed "s/^/0 plain-tuned /"
for r in 1 2; do
  g --config '128x256x64 c2x1 cooperative' | sed "s/^/$r plain-k64 /"
  g --config '128x256x32 c2x1 cooperative' | sed "s/^/$r plain-k32 /"
  g --hook wait_source_rows --any-order --config '128x256x64 c2x1 cooperative hooked+source' | sed "s/^/$r source-k64 /"
  g --hook wait_source_rows --any-order --config '128x256x32 c2x1 cooperative hooked+source8' | sed "s/^/$r source8-k32 /"
done 2>&1 | tee $O/gemm_alone.txt
echo "gemm alone done at $((SECONDS-t0)) s"
echo "done at $((SECONDS-t0)) s"
cd $O && tar czf logs.tgz s session.log tests_w1.log && rm -rf s
