#!/bin/bash
# 14th session, call 5: the final tree (8c3b763): the acceptance command, then a second sweep
WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu examples gemm overlap > /tmp/s1.txt 2>&1
grep -E "rc=|^ +[0-9]+ +[0-9]+ +[0-9]+ \||FAILED" /tmp/s1.txt | head -40
sed -n '/^op  /,/^###/p' /tmp/s1.txt | head -24
OUT=$OUT/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap > /tmp/s2.txt 2>&1
sed -n '/^op  /,/^###/p' /tmp/s2.txt | head -24
cp /tmp/s1.txt $OUT/session1.txt
