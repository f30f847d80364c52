#!/bin/bash
# Twentieth session, call 8 (1 x H200, fresh), branch probe-variants (start-probe + source-probes): the per-tile
# mainloops and gaps of the source epilogue's variants, B [K, N], 2048 x 8192 x 4096 (as call 7).
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=build-gpu; t0=$SECONDS
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-DWEFT_START_PROBE > "$OUT/configure.log" 2>&1
cmake --build $B -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
echo "built at $((SECONDS - t0)) s"
for cfg in '128x256x64 c2x1 cooperative hooked+source' '128x256x32 c2x1 cooperative hooked+source8' \
           '128x256x32 c2x1 cooperative hooked+source-noreuse' '128x256x32 c2x1 cooperative hooked+source-noreuse-delay'; do
  WEFT_START_PROBE=1 $B/weftrun -n 1 --timeout 60 -- $B/weft-bench gemm --no-hold --samples 6 --shapes 2048,8192,4096 \
    --b-layout kn --hook wait_source_rows --any-order --config "$cfg, swizzle 2 along M" > /tmp/sp.log 2>&1
  { grep start-probe /tmp/sp.log | tail -n 2; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " /tmp/sp.log; } | sed "s/^/$cfg: /"
done | tee "$OUT/start_probe_variants.txt"
echo "done at $((SECONDS - t0)) s"
