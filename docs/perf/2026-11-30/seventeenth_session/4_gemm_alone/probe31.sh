#!/bin/bash
# 17th session call 4 (2 x H200): the GEMM alone against cuBLAS, 3 processes (each tunes afresh),
# then 1000 x 14336 x 8192 with each candidate forced, 2 rounds.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw --format=csv,noheader,nounits -lms 500 > $OUT/clocks.log 2>&1 &
OUT=$OUT/build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -1
B=build-gpu
for r in 1 2 3; do
  $B/weftrun -n 2 --timeout 300 -- $B/weft-bench gemm --samples 10 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r /" | tee -a $OUT/gemm3.txt
done
for r in 1 2; do
  for cfg in "128x128x64 c1x2 pingpong" "64x256x64 c1x1 pingpong" "128x256x64 c2x1 cooperative stream-K" "128x256x64 c1x2 cooperative" "128x256x64 c2x1 cooperative" "256x128x64 c2x1 cooperative" "128x128x64 c2x1 cooperative"; do
    $B/weftrun -n 2 --timeout 120 -- $B/weft-bench gemm --shapes '1000,14336,8192' --samples 15 --config "$cfg" 2>&1 | grep -E "^ +1000 " | sed "s/^/$r /" | tee -a $OUT/forced.txt
  done
done
kill %1; rm -rf $OUT/build
