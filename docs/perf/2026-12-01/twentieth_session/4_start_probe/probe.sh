#!/bin/bash
# Twentieth session, calls 5-7 (1 x H200, fresh each; call 7: the first 4 tiles' mainloops and the gaps between
# them, at 2048 and 4096 rows), branch start-probe (main + src/gemm/start_probe.cuh, built with
# -DWEFT_START_PROBE; carry [".deps"]): per CTA, SM cycles from the mainloop's load_init to the producer's first
# tile load, the consumers' first mainloop start and end, and the epilogue producer's first source load; medians
# over CTAs per launch. Hooked (waiting for A rows, none late) against hooked+source, 128x256x64 c2x1 cooperative,
# B [N, K] and [K, N], 2048 and 4096 x 8192 x 4096 as run in call 7 (calls 5-6 ran 1024 and 2048 rows: the shape
# loop below then read `1024,8192,4096 2048,8192,4096`). --no-hold: the probe synchronises after each launch.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=build-gpu; t0=$SECONDS
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-DWEFT_START_PROBE > "$OUT/configure.log" 2>&1
cmake --build $B -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
echo "built at $((SECONDS - t0)) s"
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv
C='128x256x64 c2x1 cooperative'
for r in 1 2; do
  for shape in 2048,8192,4096 4096,8192,4096; do
    for layout in nk kn; do
      if [ $layout = nk ]; then
        WEFT_START_PROBE=1 $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --no-hold --samples 8 --shapes $shape \
          --hook wait_a_rows --any-order --config "$C hooked, swizzle 2 along M" > /tmp/sp.log 2>&1
        { grep start-probe /tmp/sp.log | tail -n 3; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " /tmp/sp.log; } | sed "s/^/$r $layout $shape: /"
      fi
      WEFT_START_PROBE=1 $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --no-hold --samples 8 --shapes $shape \
        --b-layout $layout --hook wait_source_rows --any-order --config "$C hooked+source, swizzle 2 along M" > /tmp/sp.log 2>&1
      { grep start-probe /tmp/sp.log | tail -n 3; grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " /tmp/sp.log; } | sed "s/^/$r $layout $shape: /"
    done
  done
done | tee "$OUT/start_probe_tiles.txt"
echo "done at $((SECONDS - t0)) s"
