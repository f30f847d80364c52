#!/bin/bash
# 16th session call 4 (2 x H200): A/B on one machine, main as it was (old: waits in the scheduler) against this
# tree (new: waits in the load collectives): GEMM+ReduceScatter and GEMM+AllReduce sweeps, interleaved, 2 rounds,
# then the hooked GEMMs alone (weft-bench gemm, forced pingpong / cooperative configurations) for both.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
NEW=$PWD
OLD=/tmp/oldrepo; mkdir -p $OLD && tar -xf .deps/oldrepo.tar -C $OLD && ln -s $NEW/.deps $OLD/.deps
(cd $OLD && OUT=$OUT/old_build bash scripts/gpu_session.sh build 2>&1 | grep -E "^build|rc=" | tail -2) &
[ -x build-gpu/weft-bench ] || OUT=$OUT/new_build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | tail -2
wait
for r in 1 2; do
  for v in new old; do
    dir=$NEW; [ $v = old ] && dir=$OLD
    (cd $dir && OUT=$OUT/r${r}_$v OVERLAP_OPS=gemm_rs,gemm_ar WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 |
      grep -E "^(gemm_rs|gemm_ar) " | sed "s/^/$r $v /") | tee -a $OUT/ab.txt
  done
done
PP='128x128x64 c1x2 pingpong'; CO='128x256x64 c2x1 cooperative'
for r in 1 2; do
  for v in new old; do
    dir=$NEW; [ $v = old ] && dir=$OLD
    for spec in "--hook none --config|$PP, swizzle 1 along M" "--hook wait_source_rows --any-order --config|$PP hooked+source, swizzle 1 along M" \
                "--hook none --config|$CO, swizzle 2 along N" "--hook wait_a_rows --config|$CO hooked, swizzle 2 along N" \
                "--hook wait_source_rows --config|$CO hooked+source, swizzle 2 along N"; do
      flags=${spec%%|*}; cfg=${spec#*|}
      $dir/build-gpu/weftrun -n 2 --timeout 120 -- $dir/build-gpu/weft-bench gemm --shapes '1024,8192,4096;2048,8192,4096' --samples 15 $flags "$cfg" 2>&1 |
        grep -E "^ +(1024|2048) " | sed "s/^/$r $v [$flags] /" >> $OUT/hooks_ab.txt
    done
  done
done
cat $OUT/hooks_ab.txt
