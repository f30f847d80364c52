#!/bin/bash
# 14th session, call 7: hooked kernels keep setmaxnreg (inline waits; consumers count out) - A/B against 8c3b763, tests, sweep
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
mkdir -p /tmp/old && tar cf - --exclude=./build-gpu --exclude=./build . | tar xf - -C /tmp/old
cp .deps/old/src/gemm/tile_hooks.cuh /tmp/old/src/gemm/tile_hooks.cuh
cmake -S /tmp/old -B /tmp/old/build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
(cmake --build /tmp/old/build -j 12 --target weft-bench weftrun >/tmp/old_build.log 2>&1; echo "old build rc=$?") &
OUT=$OUT/s bash scripts/gpu_session.sh build gpu 2>&1 | grep -E "rc=|FAILED" | head -8
wait
B=build-gpu
for r in 1 2; do for v in new old; do
  [ $v = old ] && B=/tmp/old/build || B=build-gpu
  for spec in "wait_source_rows|2048,8192,4096;4096,8192,4096;1024,8192,4096" "wait_a_rows|2048,8192,8192;4096,14336,8192"; do
    $B/weftrun -n 2 --timeout 120 -- $B/weft-bench gemm --shapes "${spec#*|}" --hook "${spec%%|*}" --samples 10 2>/dev/null |
      grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ \|' | sed "s/^/$r $v ${spec%%|*} /"
  done
done; done | tee $OUT/hooks_ab.txt
OUT=$OUT/s2 OVERLAP_ARGS='--samples 15' bash scripts/gpu_session.sh overlap 2>&1 | sed -n '/^op  /,/^###/p' | head -24
