#!/bin/bash
# 17th session call 8 (1 x H200), branch swapped-exp: the 144-wide swapped tile without a cluster (no B multicast).
set -u
export PATH="$PATH:/usr/local/cuda/bin"
OUT=$OUT/build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -1
B=build-gpu
for cfg in "144x256x64 c1x1 cooperative swapped" "144x256x64 c1x2 cooperative swapped" "64x256x64 c1x1 pingpong"; do
  $B/weftrun -n 1 --timeout 60 -- $B/weft-bench gemm --shapes '1000,14336,8192;4096,8192,8192' --samples 10 --config "$cfg" 2>&1 |
    grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | tee -a $OUT/swapped_c1x1.txt
done
rm -rf $OUT/build
