#!/bin/bash
# 17th session call 1 (2 x H200): branch coop-steps (this tree) against main (.deps/mainrepo.tar):
# GPU tests on the branch, then GEMM+ReduceScatter and GEMM+AllReduce sweeps, interleaved, 2 rounds.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
NEW=$PWD
OLD=/tmp/mainrepo; mkdir -p $OLD && tar -xf .deps/mainrepo.tar -C $OLD && ln -s $NEW/.deps $OLD/.deps
t0=$SECONDS
(cd $OLD && OUT=$OUT/main_build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | sed 's/^/main /' | tail -2) &
OUT=$OUT/branch_build bash scripts/gpu_session.sh build 2>&1 | grep -E "rc=" | sed 's/^/branch /' | tail -2
wait
echo "builds done at $((SECONDS-t0)) s"
OUT=$OUT/branch_gpu WEFT_LOG_LEVEL=info bash scripts/gpu_session.sh gpu 2>&1 | grep -E "^### " | tee $OUT/branch_tests.txt
echo "tests done at $((SECONDS-t0)) s"
for r in 1 2; do
  order="new old"; [ $r = 2 ] && order="old new"
  for v in $order; do
    dir=$NEW; [ $v = old ] && dir=$OLD
    (cd $dir && OUT=$OUT/r${r}_$v OVERLAP_OPS=gemm_rs,gemm_ar WEFT_BENCH_RANKS=1 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 |
      grep -E "^(gemm_rs|gemm_ar) " | sed "s/^/$r $v /") | tee -a $OUT/ab.txt
    echo "round $r $v done at $((SECONDS-t0)) s"
  done
done
cd $OUT && tar -czf all_logs.tgz main_build branch_build branch_gpu r1_* r2_* 2>/dev/null && rm -rf main_build branch_build branch_gpu r1_* r2_*
ls $OUT
