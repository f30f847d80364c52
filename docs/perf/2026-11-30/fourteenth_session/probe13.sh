#!/bin/bash
# 14th session, call 4: the acceptance command on 27904b1 + a 128x224 tile (1000 x 14336: 8 x 64 tiles = 3.88 waves), then a second sweep
WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh build gpu examples gemm overlap > /tmp/s1.txt 2>&1
grep -E "rc=|^ +[0-9]+ +[0-9]+ +[0-9]+ \||FAILED" /tmp/s1.txt | head -40
sed -n '/x ideal/,$p' /tmp/s1.txt | grep -vE "^(build|weft-info|gpu tests|provoked|weftrun|tuning|example|gemm vs|overlap sweep|clocks|machine)" | head -40
OUT=$OUT/sweep2 WEFT_LOG_LEVEL=info WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh gemm overlap > /tmp/s2.txt 2>&1
grep -E "rc=|^ +[0-9]+ +[0-9]+ +[0-9]+ \||FAILED" /tmp/s2.txt | head -30
cp /tmp/s1.txt $OUT/session1.txt; cp /tmp/s2.txt $OUT/sweep2/session2.txt
