#!/bin/bash
# Written in the eighteenth session for the next one (not run yet): where the hooked+source GEMM's ~6 % per
# tile goes. Nsight Compute, full set with source counters, on GEMM+ReduceScatter's ring-step kernel and its
# plain twin, B as [K, N], 1024 x 8192 x 4096, on a one-GPU machine (Firecracker runtime: ncu reads counters
# there; KINDS.md). Run from the repository root with the device tool, carry [".deps"]:
#   bash docs/perf/2026-12-01/eighteenth_session/next_source_profile.sh
# Returns $OUT/profile.tgz: the two reports (open with ncu-ui, or `ncu --import X.ncu-rep --page source`),
# their details pages and SASS-level source tables as text, and the build log.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
O=$OUT/profile; mkdir -p "$O"; t0=$SECONDS
B=build-prof  # a build of its own, with line information in the device code
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-lineinfo > $O/configure.log 2>&1
cmake --build $B -j "$(nproc)" --target weft-bench weftrun > $O/build.log 2>&1 || { tail -30 $O/build.log; exit 1; }
echo "built at $((SECONDS-t0)) s"
# The forced full names launch no tuning candidates: prepare()'s warm launch, then the samples. --no-hold:
# the bench's hold kernel times out under the profiler.
S="--clock-control none --kernel-name device_kernel --launch-skip 4 --launch-count 1 --set full --import-source yes"
run() {  # name, weft-bench arguments...
  local name=$1; shift
  $B/weftrun -n 1 --timeout 300 -- ncu $S -o $O/$name $B/weft-bench gemm --b-layout kn --shapes 1024,8192,4096 \
    --samples 2 --no-hold "$@" > $O/$name.log 2>&1
  echo "$name: rc=$? at $((SECONDS-t0)) s"
  ncu --import $O/$name.ncu-rep --page details > $O/${name}_details.txt 2>&1
  ncu --import $O/$name.ncu-rep --page source --csv --print-source sass > $O/${name}_sass.csv 2>&1
}
run plain --config '128x256x64 c2x1 cooperative, swizzle 2 along M'
run source --hook wait_source_rows --any-order --config '128x256x64 c2x1 cooperative hooked+source, swizzle 2 along M'
grep -E "Duration|Executed Ipc|Issue Slots|Registers Per|Shared Memory Configuration Size" $O/plain_details.txt $O/source_details.txt
cd $OUT && tar czf profile.tgz profile && rm -rf profile
