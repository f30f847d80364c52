#!/bin/bash
# For the next session, on branch source-k32 (1 x H200, carry .deps; not run yet): D's stores in shared memory
# of their own (hooked+source-noreuse, 7 stages of K = 32) against the current hooked+source and source8-k32,
# B [K, N], 2 rounds. gpu_session.sh builds and runs the GPU tests (the waiting test covers the new kernels).
set -u
OUT=$OUT/session bash scripts/gpu_session.sh build gpu | tail -n 8
B=build-gpu
for r in 1 2; do
  for cfg in '128x256x64 c2x1 cooperative hooked+source' '128x256x32 c2x1 cooperative hooked+source8' \
             '128x256x32 c2x1 cooperative hooked+source-noreuse' '128x256x64 c2x1 cooperative'; do
    hook=(--hook wait_source_rows --any-order); [[ $cfg == *hooked* ]] || hook=()
    $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout kn --samples 15 \
      --shapes '1024,8192,4096;2048,8192,4096;4096,8192,4096' "${hook[@]}" --config "$cfg" 2>&1 |
      grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r /"
  done
done | tee "$OUT/gemm_alone.txt"
