#!/bin/bash
# 14th session, call 8: the final tree's GPU tests (a host-side check added after call 5)
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null 2>&1
t0=$SECONDS; cmake --build build-gpu -j 32 --target weft_gpu_tests weftrun >$OUT/build.log 2>&1; echo "build rc=$? $((SECONDS - t0)) s"
for n in 1 2; do build-gpu/weftrun -n $n --timeout 200 -- build-gpu/tests/weft_gpu_tests >$OUT/gpu_tests_w$n.log 2>&1; echo "world $n rc=$?"
  grep -E "^\[  (PASSED|FAILED) " $OUT/gpu_tests_w$n.log; done
