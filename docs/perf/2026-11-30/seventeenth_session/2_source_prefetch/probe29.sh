#!/bin/bash
# 17th session call 2 (2 x H200): the source prefetch (WEFT_SOURCE_PREFETCH 0 / 1 / 2) - GPU tests (default 0),
# then GEMM+ReduceScatter and GEMM+AllReduce (--check) and the hooked+source GEMMs alone, modes in turn, 2 rounds.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
t0=$SECONDS
OUT=$OUT/build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -1
OUT=$OUT/gpu WEFT_LOG_LEVEL=info bash scripts/gpu_session.sh gpu 2>&1 | grep -E "^### " | tee $OUT/tests.txt
echo "tests done at $((SECONDS-t0)) s"
B=build-gpu
CO='128x256x64 c2x1 cooperative'
for r in 1 2; do
  modes="0 1 2"; [ $r = 2 ] && modes="2 1 0"
  for p in $modes; do
    for op in "gemm_rs --m 2048,4096,8192 --n 8192 --k 8192" "gemm_rs --m 2048 --n 8192 --k 28672"; do
      WEFT_SOURCE_PREFETCH=$p $B/weftrun -n 2 --timeout 200 -- $B/weft-bench $op --check --samples 15 > $OUT/r${r}_p${p}_${op%% *}.log 2>&1
      grep -E "^ *[0-9]+ +[0-9]+ +[0-9]+ " $OUT/r${r}_p${p}_${op%% *}.log | sed "s/^/$r p$p ${op%% *} /" | tee -a $OUT/ab.txt
    done
    for spec in "--hook none --config|$CO, swizzle 2 along N" "--hook wait_source_rows --any-order --config|$CO hooked+source, swizzle 1 along M"; do
      flags=${spec%%|*}; cfg=${spec#*|}
      WEFT_SOURCE_PREFETCH=$p $B/weftrun -n 2 --timeout 120 -- $B/weft-bench gemm --shapes '1024,8192,4096;2048,8192,4096' --samples 15 $flags "$cfg" 2>&1 |
        grep -E "^ +(1024|2048) " | sed "s/^/$r p$p [${flags#--hook }] /" | tee -a $OUT/ab.txt
    done
    echo "round $r p$p done at $((SECONDS-t0)) s"
  done
done
cd $OUT && tar -czf all_logs.tgz build gpu r*_p*.log && rm -rf build gpu r*_p*.log
ls $OUT
