#!/bin/bash
# 14th session, call 6: where the one-launch ring's time goes at 2048 x 8192 x 8192 (trace, tile waits), against the plain first step
R="gemm_rs --m 2048 --n 8192 --k 8192"
TRACE_SPECS="$R --way one_launch;$R --way plain_first;$R --way one_launch --chunks 2" WAITS_SPECS="$R --way one_launch" \
  bash scripts/gpu_session.sh build trace waits 2>&1 | grep -vE "^(weft-info|gpu tests|machine|clocks)" | cut -c1-600 | tail -n 80
