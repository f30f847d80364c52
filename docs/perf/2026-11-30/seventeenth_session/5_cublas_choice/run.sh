#!/bin/bash
# 17th session call 5 (1 x H200): cuBLAS's choice at the GEMM-alone shapes (CUBLASLT_LOG_LEVEL=5, first call only).
export PATH="$PATH:/usr/local/cuda/bin"
cd .deps/cublas_probe && nvcc -O2 -gencode=arch=compute_90a,code=sm_90a -o probe probe.cu -lcublas || exit 1
for s in "1000 14336 8192" "2048 14336 8192" "4096 14336 8192" "1024 8192 4096"; do
  CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=$OUT/lt_${s// /x}.log ./probe $s
  grep -o "algo=[^)]*\]" $OUT/lt_${s// /x}.log | head -2; grep -io "tile[^,]*\|stages[^,]*\|splitK[^,]*" $OUT/lt_${s// /x}.log | sort | uniq -c | head
done
