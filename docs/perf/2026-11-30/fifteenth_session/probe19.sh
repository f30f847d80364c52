#!/bin/bash
# 15th session, call 2: the acceptance command and a second overlap sweep on this tree, then where the
# hooked+source GEMM's time goes at 2048 x 8192 x 4096 (forced configurations, 2 rounds).
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
A="$OUT/acceptance"; mkdir -p "$A"
OUT=$A WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu examples gemm overlap 2>&1 | tail -n 60
OUT=$A/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 | tail -n 30
B=build-gpu
G="$B/weftrun -n 2 --timeout 120 -- $B/weft-bench gemm --shapes 2048,8192,4096 --samples 15"
PP='128x128x64 c1x2 pingpong'; CO='128x256x64 c2x1 cooperative'
for r in 1 2; do
  for spec in "--config|$PP, swizzle 1 along M" \
              "--hook wait_source_rows --any-order --no-source-rows 0,2048 --config|$PP hooked+source, swizzle 1 along M" \
              "--hook wait_source_rows --any-order --no-source-rows 0,1024 --config|$PP hooked+source, swizzle 1 along M" \
              "--hook wait_source_rows --any-order --config|$PP hooked+source, swizzle 1 along M" \
              "--config|$CO, swizzle 2 along N" \
              "--hook wait_a_rows --config|$CO hooked, swizzle 2 along N" \
              "--hook wait_source_rows --no-source-rows 0,2048 --config|$CO hooked+source, swizzle 2 along N" \
              "--hook wait_source_rows --config|$CO hooked+source, swizzle 2 along N"; do
    flags=${spec%%|*}; cfg=${spec#*|}
    $G $flags "$cfg" 2>&1 | grep -E "^ +2048 " | sed "s/^/$r [$flags] /" >> $OUT/decompose.txt
  done
done
cat $OUT/decompose.txt
