#!/bin/bash
# weft's hooked pingpong scheduler: as on main, without leave() (the flags' count-out), without the tile waits.
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
C="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include -I../../include -I../hookvar/src/gemm"
t0=$SECONDS
for v in asis noleave nowaits; do
  D=""; [ $v = noleave ] && D=-DPROBE_NO_LEAVE; [ $v = nowaits ] && D=-DPROBE_NO_WAITS
  mkdir -p p_$v
  for f in k_plain.cu k_hooked.cu main_hook.cu; do
    (nvcc $C $D -Xptxas -v -c $f -o p_$v/${f%.cu}.o > p_$v/${f%.cu}.log 2>&1 || grep -v C7507 p_$v/${f%.cu}.log | head -20) &
  done
done
wait
for v in asis noleave nowaits; do
  echo "$v hooked: $(grep -c C7507 p_$v/k_hooked.log) C7507, $(grep -oE 'Used [0-9]+ registers' p_$v/k_hooked.log | sort -u | tr '\n' ' ') $(grep -oE '[0-9]+ bytes spill stores' p_$v/k_hooked.log | sort -u | tr '\n' ' ')"
  nvcc $C p_$v/k_plain.o p_$v/k_hooked.o p_$v/main_hook.o -lcuda -o p_$v/probe
done
echo "built in $((SECONDS - t0)) s"
for r in 1 2 3; do for v in asis noleave nowaits; do ./p_$v/probe "$r $v"; done; done
