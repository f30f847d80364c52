#!/bin/bash
# 16th session call 7 (2 x H200), main at aea81a5: GEMM+ReduceScatter at K = 8192 with its ring steps' GEMMs as
# the tuner chose them against cooperative 128x256 ones (the tuning cache rewritten), alternated, 2 rounds, per M.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
B=build-gpu
OUT=$OUT/build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -1
R="$B/weftrun -n 2 --timeout 200 --"
for m in 2048 4096 8192; do
  RS="$B/weft-bench gemm_rs --m $m --n 8192 --k 8192 --samples 15 --json"
  WEFT_TUNE_CACHE=$OUT/tc_$m $R $RS 2>/dev/null | grep '"op"' | sed "s/^/$m tuned0 /" >> $OUT/rs.txt
  python3 .deps/rewrite_cache.py $OUT/tc_$m $OUT/coop_$m $((m / 2)) >> $OUT/rewrite.txt
  for r in 1 2; do
    for v in coop tuned; do
      c=$OUT/tc_$m; [ $v = coop ] && c=$OUT/coop_$m
      WEFT_TUNE_CACHE=$c $R $RS 2>/dev/null | grep '"op"' | sed "s/^/$m $v$r /" >> $OUT/rs.txt
    done
  done
done
cat $OUT/rewrite.txt
python3 - $OUT/rs.txt <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m, v, js = line.split(" ", 2)
    r = json.loads(js)
    print(f"{m:>5} {v:7} {r['weft_ms']:.4f} ms  x ideal {r['vs_ideal']:.3f}  GEMM alone {r['ideal_ms']:.4f}  fused GEMMs {r.get('gemm_hooked_ms', 0):.4f}  {r['path']}: {r['config']}")
PY
