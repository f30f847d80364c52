#!/bin/bash
# Twentieth session, call 4 (1 x H200, fresh; main's code, carry [".deps"]): is the consumers' longer wait for a
# tile's first k-block in the hooked+source kernel (1_source_probes/stall_table.txt: 315 samples against the plain
# kernel's 105) the hook's or the source's? Nsight Compute, full set, on the plain, hooked (waiting for A rows) and
# hooked+source kernels (B [N, K], 128x256x64 c2x1 cooperative, swizzle 2 along M) at 1024 x 8192 x 4096, and the
# plain and hooked+source ones (B [K, N]) at 2048 rows (is the extra wait per launch or per tile?).
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=build-gpu; D=docs/perf/2026-12-01/twentieth_session
t0=$SECONDS
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-lineinfo > "$OUT/configure.log" 2>&1
cmake --build $B -j "$(nproc)" > "$OUT/build.log" 2>&1 || { tail -n 30 "$OUT/build.log"; exit 1; }
echo "built at $((SECONDS - t0)) s"
O=$OUT/profile; mkdir -p "$O"
S="--clock-control none --kernel-name device_kernel --launch-skip 4 --launch-count 1 --set full --import-source yes"
run() {  # name, shape, weft-bench arguments...
  local name=$1 shape=$2; shift 2
  $B/weftrun -n 1 --timeout 300 -- ncu $S -o "$O/$name" $B/weft-bench gemm --shapes "$shape" --samples 2 --no-hold "$@" \
    > "$O/${name}_bench.log" 2>&1
  echo "$name: rc=$? at $((SECONDS - t0)) s"
  ncu --import "$O/$name.ncu-rep" --page details > "$O/${name}_details.txt" 2>&1
  ncu --import "$O/$name.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip -9 > "$O/${name}_sass.csv.gz"
  rm -f "$O/$name.ncu-rep"
}
C='128x256x64 c2x1 cooperative'
run nk_plain 1024,8192,4096 --config "$C, swizzle 2 along M"
run nk_hooked 1024,8192,4096 --hook wait_a_rows --any-order --config "$C hooked, swizzle 2 along M"
run nk_source 1024,8192,4096 --hook wait_source_rows --any-order --config "$C hooked+source, swizzle 2 along M"
run kn_plain_2048 2048,8192,4096 --b-layout kn --config "$C, swizzle 2 along M"
run kn_source_2048 2048,8192,4096 --b-layout kn --hook wait_source_rows --any-order --config "$C hooked+source, swizzle 2 along M"
grep -E "^ +Duration" "$O"/*_details.txt
python3 $D/1_source_probes/stall_table.py --dir "$O" nk_plain nk_hooked nk_source | tee "$OUT/stall_table_1024.txt"
python3 $D/1_source_probes/stall_table.py --tiles 512 --dir "$O" kn_plain_2048 kn_source_2048 | tee "$OUT/stall_table_2048.txt"
(cd "$OUT" && tar czf profile.tgz profile && rm -rf profile)
echo "done at $((SECONDS - t0)) s"
