#!/bin/bash
# 14th session, call 2: the one-launch ring by chunk count (the swizzle bands follow the chunk rows)
S="--n 8192 --k 8192 --variant fused --samples 15"
specs=""
for c in 1 2 4 8; do specs+="gemm_rs --m 2048,4096 $S --way one_launch --chunks $c;"; done
specs+="gemm_rs --m 2048,4096 $S --way plain_first;"
for c in 2 8; do specs+="gemm_ar --m 2048,4096 $S --way one_launch --chunks $c;"; done
AB_ENVS="WEFT_LOG_LEVEL=warn" AB_ROUNDS=2 AB_SPECS="${specs%;}" \
  bash scripts/gpu_session.sh build ab 2>&1 | grep -E "rc=|FAILED|^  gemm" | sed -E 's/WEFT_LOG_LEVEL=warn \| //; s/--n 8192 --k 8192 --variant fused --samples 15//'
mkdir -p /tmp/x && tar xzf $OUT/logs.tgz -C /tmp/x 2>/dev/null; grep -h '"op"' /tmp/x/ab.txt 2>/dev/null | grep -o '"m":[0-9]*\|"config":"[^"]*"\|"path":"[^"]*"' | paste -sd' ' | sed 's/"m":/\n/g' | head -40
