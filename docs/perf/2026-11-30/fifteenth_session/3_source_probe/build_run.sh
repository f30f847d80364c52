#!/bin/bash
# Builds the probe's 6 kernels in parallel, then runs it.
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
F="-std=c++17 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include"
t0=$SECONDS
for f in k_*.cu main.cu; do nvcc $F -c $f -o ${f%.cu}.o > ${f%.cu}.log 2>&1 || { cat ${f%.cu}.log | grep -v C7507 | head -30; exit 1; } & done
wait
nvcc $F *.o -lcublas -o source_probe
echo "built in $((SECONDS - t0)) s"
./source_probe
