#!/bin/bash
# weft's hooked pingpong GEMM: main against a wait with no call, no count-out, and no wait code in the consumers (no C7507, no spill).
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
C="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include -I../../include -I../hookvar/src/gemm"
t0=$SECONDS
for v in asis clean; do
  D=""; [ $v = clean ] && D="-DPROBE_NOCALL -DPROBE_NO_LEAVE -DPROBE_SPLIT"
  mkdir -p c_$v
  for f in k_plain.cu k_evt.cu k_hooked.cu k_hooked_evt.cu main.cu; do
    (nvcc $C $D -Xptxas -v -c $f -o c_$v/${f%.cu}.o > c_$v/${f%.cu}.log 2>&1 || grep -v C7507 c_$v/${f%.cu}.log | head -20) &
  done
done
wait
for v in asis clean; do
  for f in c_$v/k_hooked*.log; do echo "$f: $(grep -c C7507 $f) C7507, $(grep -oE 'Used [0-9]+ registers' $f | sort -u | tr '\n' ' ') $(grep -oE '[0-9]+ bytes spill stores' $f | sort -u | tr '\n' ' ')"; done
  nvcc $C c_$v/*.o -lcuda -o c_$v/probe
done
echo "built in $((SECONDS - t0)) s"
for r in 1 2 3; do for v in asis clean; do ./c_$v/probe | sed "s/^/$r $v /" | sed 's/pingpong 128x128 c1x2, swizzle 1 along M, //' | grep -v "4096  source visitor"; done; done
