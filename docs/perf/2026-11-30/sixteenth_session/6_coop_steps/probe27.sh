#!/bin/bash
# 16th session call 8 (2 x H200): cooperative ring steps in GemmRs - GPU tests, then the GEMM+ReduceScatter and
# GEMM+AllReduce sweeps (two if time allows).
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
A="$OUT/acceptance"; mkdir -p "$A"
OUT=$A WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_OPS=gemm_rs,gemm_ar OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu overlap 2>&1 | grep -vE "^\[weft|OMP_NUM|\*\*\*|symm_mem|FutureWarning|UserWarning|return func|^$" | tail -n 40
OUT=$A/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_OPS=gemm_rs,gemm_ar OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 | grep -E "^gemm_(rs|ar) " | tail -n 16
