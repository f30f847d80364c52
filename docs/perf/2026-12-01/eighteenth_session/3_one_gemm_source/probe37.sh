#!/bin/bash
# 18th session call 3 (1 x H200): is one GEMM over both ring blocks (source on the own block's rows only, any tile
# order) as fast as the plain GEMM? Against the two-kernel ring (plain half + hooked+source half). B as [K, N] (kn),
# as GemmRs has it. 2 rounds.
set -u
export PATH="$PATH:/usr/local/cuda/bin"
O=$OUT
OUT=$O/b bash scripts/gpu_session.sh build > $O/build.log 2>&1; grep -E "build  " $O/build.log | tail -1
B=build-gpu
run() { $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout kn --samples 15 "$@" 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ "; }
for r in 1 2; do
  run --shapes '2048,8192,4096;4096,8192,4096;8192,8192,4096;1024,8192,4096' | sed "s/^/$r plain /"
  run --shapes '1024,8192,4096;2048,8192,4096;4096,8192,4096' --hook wait_source_rows --any-order | sed "s/^/$r source-all /"
  for m in 2048 4096 8192; do
    h=$((m / 2))
    run --shapes "$m,8192,4096" --hook wait_source_rows --any-order --no-source-rows 0,$h | sed "s/^/$r source-2nd-half /"
  done
done 2>&1 | tee $O/one_gemm.txt
rm -rf $O/b
