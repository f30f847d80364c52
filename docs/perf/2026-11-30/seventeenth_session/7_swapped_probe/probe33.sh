#!/bin/bash
# 17th session call 7 (1 x H200), branch swapped-exp: are swapped (D^T = B x A^T, column-major D) kernels slow in
# general? 128x256 swapped (CUTLASS 256x128 c2x1) against 256x128 c2x1 and 128x256 c1x2 plain, and 144x256 swapped.
set -u
export PATH="$PATH:/usr/local/cuda/bin"
OUT=$OUT/build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -1
B=build-gpu
for r in 1 2; do
  for cfg in "128x256x64 c1x2 cooperative swapped" "144x256x64 c1x2 cooperative swapped" "256x128x64 c2x1 cooperative" "128x256x64 c1x2 cooperative" "64x256x64 c1x1 pingpong"; do
    $B/weftrun -n 1 --timeout 60 -- $B/weft-bench gemm --shapes '1000,14336,8192;1024,14336,8192;4096,8192,8192' --samples 10 --config "$cfg" 2>&1 |
      grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r /" | tee -a $OUT/swapped.txt
  done
done
rm -rf $OUT/build
