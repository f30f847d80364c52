#!/bin/bash
# 17th session call 6 (2 x H200): a swapped 144x256 tile (D^T = B x A^T) added - GPU tests, examples, GEMM vs cuBLAS,
# the overlap acceptance (two sweeps), then two more GEMM-alone processes and 1000 x 14336 x 8192 forced.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
A="$OUT/acceptance"; mkdir -p "$A"
OUT=$A WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu examples gemm overlap 2>&1 | tail -n 50
OUT=$A/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 | grep -E "^(ag_gemm|gemm_rs|gemm_ar) "
B=build-gpu
for r in 2 3; do
  $B/weftrun -n 2 --timeout 300 -- $B/weft-bench gemm --samples 10 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r /" | tee -a $OUT/gemm_more.txt
done
for r in 1 2; do
  for cfg in "144x256x64 c1x2 cooperative swapped" "64x256x64 c1x1 pingpong" "128x128x64 c1x2 pingpong"; do
    $B/weftrun -n 2 --timeout 120 -- $B/weft-bench gemm --shapes '1000,14336,8192' --samples 15 --config "$cfg" 2>&1 | grep -E "^ +1000 " | sed "s/^/$r /" | tee -a $OUT/forced.txt
  done
done
