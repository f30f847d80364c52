#!/bin/bash
# 18th session call 1 (1 x H200), branch swapped-144 on main fe90a42: build, GPU tests, the gemm stage three times
# (tuner free to pick the swapped 144x256 tile), then the swapped tile and 64x256 pingpong forced, 2 rounds.
set -u
export PATH="$PATH:/usr/local/cuda/bin"
O=$OUT
OUT=$O/main WEFT_LOG_LEVEL=info bash scripts/gpu_session.sh build gpu gemm > $O/main.log 2>&1
tail -15 $O/main.log
B=build-gpu
for r in 2 3; do
  $B/weftrun -n 1 --timeout 300 -- $B/weft-bench gemm --samples 10 > $O/gemm$r.txt 2>&1
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " $O/gemm$r.txt | sed "s/^/tuned$r /"
done
for r in 1 2; do
  for cfg in "144x256x64 c1x2 cooperative swapped" "64x256x64 c1x1 pingpong" "128x256x64 c2x1 cooperative"; do
    $B/weftrun -n 1 --timeout 60 -- $B/weft-bench gemm --shapes '1000,14336,8192;1024,14336,8192;2048,14336,8192;4096,8192,8192' --samples 10 --config "$cfg" 2>&1 |
      grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r /" | tee -a $O/forced.txt
  done
done
rm -rf $O/main/build 2>/dev/null
cd $O && tar czf all.tgz main main.log gemm2.txt gemm3.txt forced.txt && rm -rf main gemm2.txt gemm3.txt
