#!/bin/bash
# 16th session call 5 (2 x H200): why GEMM+ReduceScatter's step GEMMs (1024 x 8192 x 4096 at 2048 rows) run the
# 128x128 pingpong kernel where weft-bench gemm times the cooperative one 12 % faster: the bench's view of the
# candidates, the tuner's (debug log), and the operator with every 1024-row choice rewritten to cooperative.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
B=build-gpu
OUT=$OUT/build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -1
R="$B/weftrun -n 2 --timeout 200 --"
for cfg in "" "128x128x64 c1x2 pingpong, swizzle 1 along M" "128x128x64 c1x2 pingpong, swizzle 4 along M" \
           "128x128x64 c1x2 pingpong, swizzle 8 along M" "128x256x64 c2x1 cooperative, swizzle 2 along N" \
           "128x256x64 c2x1 cooperative, swizzle 1 along M" "128x256x64 c2x1 cooperative, swizzle 4 along M"; do
  $R $B/weft-bench gemm --shapes 1024,8192,4096 --samples 15 ${cfg:+--config "$cfg"} 2>&1 | grep -E "^ +1024 " | tee -a $OUT/gemm1024.txt
done
RS="$B/weft-bench gemm_rs --m 2048 --n 8192 --k 8192 --samples 15 --way plain_first --json"
WEFT_TUNE_CACHE=$OUT/tc_tuned WEFT_LOG_LEVEL=debug $R $RS > $OUT/rs_tuned_1.log 2>&1
python3 .deps/rewrite_cache.py $OUT/tc_tuned $OUT/tc_coop | tee $OUT/rewrite.txt
for r in 1 2; do
  [ $r = 2 ] && WEFT_TUNE_CACHE=$OUT/tc_tuned WEFT_LOG_LEVEL=debug $R $RS > $OUT/rs_tuned_2.log 2>&1
  WEFT_TUNE_CACHE=$OUT/tc_coop WEFT_LOG_LEVEL=debug $R $RS > $OUT/rs_coop_$r.log 2>&1
done
for f in $OUT/rs_*.log; do echo "== $f"; grep -E "\"op\"|from the tuning cache|chose" $f | grep -v "^\[weft rank 1" | cut -c1-260 | head -12; done
grep -hE "1024x8192x4096.*(ms|chose)" $OUT/rs_tuned_1.log | grep "rank 0" | cut -c1-250 | head -80
