#!/bin/bash
# 16th session call 6 (2 x H200): d66046c (tuner times graph launches) - GPU tests, provoked hangs, examples,
# GEMM vs cuBLAS, overlap acceptance in two sweeps, then the tuner's view at 2048 x 8192 x 8192 GEMM+ReduceScatter.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
A="$OUT/acceptance"; mkdir -p "$A"
OUT=$A WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu examples gemm overlap 2>&1 | tail -n 62
OUT=$A/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 | tail -n 26
WEFT_LOG_LEVEL=debug build-gpu/weftrun -n 2 --timeout 200 -- build-gpu/weft-bench gemm_rs --m 2048 --n 8192 --k 8192 --samples 15 --json > $OUT/rs2048_debug.log 2>&1
grep -E "rank 0.*(chose|finalist)|\"op\"" $OUT/rs2048_debug.log | cut -c1-300
