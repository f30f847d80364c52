#!/bin/bash
# weft's hooked pingpong scheduler, three builds: as it is, without its wait code (rotation only), trivial (no change to the tile).
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
C="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include -I../../include -I../hookvar/src/gemm"
t0=$SECONDS
for v in asis nowait trivial; do
  D=""; [ $v = nowait ] && D=-DPROBE_NO_WAIT; [ $v = trivial ] && D=-DPROBE_TRIVIAL
  mkdir -p $v
  for f in k_plain.cu k_hooked.cu main_hook.cu; do
    (nvcc $C $D -Xptxas -v -c $f -o $v/${f%.cu}.o > $v/${f%.cu}.log 2>&1 || grep -v C7507 $v/${f%.cu}.log | head -20) &
  done
done
wait
for v in asis nowait trivial; do
  echo "$v hooked: $(grep -c C7507 $v/k_hooked.log) C7507, $(grep -oE 'Used [0-9]+ registers' $v/k_hooked.log | sort -u | tr '\n' ' ')"
  nvcc $C $v/k_plain.o $v/k_hooked.o $v/main_hook.o -lcuda -o $v/probe
done
echo "built in $((SECONDS - t0)) s"
for r in 1 2; do for v in asis nowait trivial; do ./$v/probe "$r $v"; done; done
