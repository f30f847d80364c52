#!/bin/bash
# weft's pingpong GEMM, hooked scheduler as on main (asis) against consumers without wait code (split, .deps/hookvar).
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
C="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include -I../../include"
t0=$SECONDS
for v in asis split; do
  I=-I../../src/gemm; [ $v = split ] && I="-I../hookvar/src/gemm -DPROBE_SPLIT"
  mkdir -p $v
  for f in k_plain.cu k_evt.cu k_hooked.cu k_hooked_evt.cu main.cu; do
    (nvcc $C $I -Xptxas -v -c $f -o $v/${f%.cu}.o > $v/${f%.cu}.log 2>&1 || grep -v C7507 $v/${f%.cu}.log | head -20) &
  done
done
wait
for v in asis split; do
  for f in $v/k_hooked*.log; do echo "$f: $(grep -c C7507 $f) C7507, $(grep -oE 'Used [0-9]+ registers' $f | sort -u | tr '\n' ' ')"; done
  nvcc $C $v/*.o -lcuda -o $v/probe
done
echo "built in $((SECONDS - t0)) s"
for r in 1 2; do for v in asis split; do ./$v/probe | sed "s/^/$r $v /" | sed 's/pingpong 128x128 c1x2, swizzle 1 along M, //'; done; done
