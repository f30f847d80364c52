#!/bin/bash
# 14th session, call 1: tiles without a source in the one-launch ring (source_rows.cuh); tests; one launch vs plain first
S="--n 8192 --k 8192 --variant fused --samples 15"
AB_ENVS="WEFT_LOG_LEVEL=warn" AB_ROUNDS=2 \
AB_SPECS="gemm_rs --m 2048,4096,8192 $S --way one_launch;gemm_rs --m 2048,4096,8192 $S --way plain_first;gemm_ar --m 2048,4096,8192 $S --way one_launch;gemm_ar --m 2048,4096,8192 $S --way plain_first" \
  bash scripts/gpu_session.sh build gpu ab 2>&1 | grep -E "rc=|FAILED|Failed|ab_table|^  gemm|A/B" 
grep -E "FAILED|Skipped|tests passed|tests ran" $OUT/gpu_tests_w*.log | head -20
