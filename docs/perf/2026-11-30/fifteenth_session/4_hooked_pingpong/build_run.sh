#!/bin/bash
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
F="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../../include -I../../src/gemm -I../cutlass/include -I../cutlass/util/include -I../nvidia/cu13/include"
t0=$SECONDS
for f in k_*.cu main.cu; do (nvcc $F -Xptxas -v -c $f -o ${f%.cu}.o > ${f%.cu}.log 2>&1 || { grep -v C7507 ${f%.cu}.log | head -30; }) & done
wait
for f in k_*.log; do echo "$f: $(grep -c C7507 $f) C7507, $(grep -oE 'Used [0-9]+ registers' $f | sort -u | tr '\n' ' ') $(grep -oE '[0-9]+ bytes spill stores' $f | sort -u | tr '\n' ' ')"; done
nvcc $F *.o -lcuda -o probe2
echo "built in $((SECONDS - t0)) s"
./probe2
