#!/bin/bash
# The hooked pingpong GEMM without and with the fourteenth session's setmaxnreg patch (.deps/setmax), 2 rounds each.
# .deps/setmax: include/ and src/gemm/ copied there, with docs/perf/2026-11-30/fourteenth_session/7_setmaxnreg_ab/setmaxnreg.patch applied (patch -p1).
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
C="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include"
t0=$SECONDS
mkdir -p old new
for f in k_*.cu main.cu; do
  (nvcc $C -I../../include -I../../src/gemm -Xptxas -v -c $f -o old/${f%.cu}.o > old/${f%.cu}.log 2>&1 || grep -v C7507 old/${f%.cu}.log | head -20) &
  (nvcc $C -I../setmax/include -I../setmax/src/gemm -Xptxas -v -c $f -o new/${f%.cu}.o > new/${f%.cu}.log 2>&1 || grep -v C7507 new/${f%.cu}.log | head -20) &
done
wait
for v in old new; do
  for f in $v/k_*.log; do echo "$f: $(grep -c C7507 $f) C7507, $(grep -oE 'Used [0-9]+ registers' $f | sort -u | tr '\n' ' ') $(grep -oE '[0-9]+ bytes spill stores' $f | sort -u | tr '\n' ' ')"; done
  nvcc $C $v/*.o -lcuda -o $v/probe2
done
echo "built in $((SECONDS - t0)) s"
for r in 1 2; do for v in old new; do ./$v/probe2 | sed "s/^/$r $v /"; done; done
