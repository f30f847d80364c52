#!/bin/bash
# 18th session calls 2 and 4 (2 x H200, two machines): main's HEAD (swapped 144x256 tile merged) - GPU tests, the provoked hangs,
# examples, GEMM vs cuBLAS, the overlap acceptance (two sweeps).
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
A="$OUT/acceptance"; mkdir -p "$A"
OUT=$A WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu examples gemm overlap 2>&1 | tail -n 70
OUT=$A/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 | tail -n 30
