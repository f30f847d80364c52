#!/bin/bash
# For the next session (branch source-k32, 1 x H200): D's stores in shared memory of their own
# (hooked+source-noreuse, 7 stages of K = 32) against the current hooked+source and source8-k32, B [K, N].
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
O=$OUT; t0=$SECONDS
OUT=$O/s bash scripts/gpu_session.sh build > $O/session.log 2>&1
grep -E "build:" $O/session.log | tail -1
B=build-gpu
$B/weftrun -n 1 --timeout 150 -- $B/tests/weft_gpu_tests > $O/tests_w1.log 2>&1
echo "tests, world 1: $(grep -E '^\[  (PASSED|FAILED) ' $O/tests_w1.log | tr '\n' ' ') at $((SECONDS-t0)) s"
g() { $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout kn --samples 15 --shapes '1024,8192,4096;2048,8192,4096;4096,8192,4096' "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ "; }
for r in 1 2; do
  g --config '128x256x64 c2x1 cooperative' | sed "s/^/$r plain-k64 /"
  g --hook wait_source_rows --any-order --config '128x256x64 c2x1 cooperative hooked+source' | sed "s/^/$r source-k64 /"
  g --hook wait_source_rows --any-order --config '128x256x32 c2x1 cooperative hooked+source8' | sed "s/^/$r source8-k32 /"
  g --hook wait_source_rows --any-order --config '128x256x32 c2x1 cooperative hooked+source-noreuse' | sed "s/^/$r noreuse-k32 /"
done 2>&1 | tee $O/gemm_alone.txt
cd $O && tar czf logs.tgz s session.log tests_w1.log && rm -rf s
