#!/bin/bash
# Written in the nineteenth session (no device time left then) for the next one; run on branch source-probes,
# one H200 (a one-GPU machine: ncu reads counters there, KINDS.md), carry [".deps"]. Two calls on one warm
# machine (the build stays between them):
#   bash docs/perf/2026-12-01/nineteenth_session/next_probe.sh time      # build, GPU tests, A/B timing (~7 min)
#   bash docs/perf/2026-12-01/nineteenth_session/next_probe.sh profile   # Nsight Compute, 4 kernels (~4 min)
# and, if a register source wins the GEMM alone, on an x2 machine (a fresh start: carry [".deps"]):
#   bash docs/perf/2026-12-01/nineteenth_session/next_probe.sh rs        # GemmRs A/B, K = 8192 (~8 min)
# The question: where the hooked+source ring-step kernel's ~6 % per source tile goes (PERF.md, eighteenth
# session, call 3). Contenders, B [K, N], the ring's step at K = 8192 over 2 ranks (K/W = 4096):
#   '128x256x64 c2x1 cooperative'                        plain, main's pick (baseline)
#   '128x256x64 c2x1 cooperative hooked+source'          main's ring-step kernel (4 source stages, reused by D)
#   '128x256x32 c2x1 cooperative'                        plain with K-blocks of 32 (the next three's baseline)
#   '128x256x32 c2x1 cooperative hooked+source8'         all 8 source sub-tiles held (call 6: no gain)
#   '128x256x32 c2x1 cooperative hooked+source-noreuse'  D's stores in smem of their own: a tile's second
#                                                        half of source loads does not wait for its first stores
#   '128x256x32 c2x1 cooperative hooked+source-noreuse-delay'  the same, each TMA store issued after the next
#                                                        sub-tile is computed (what the builder does with no source)
#   '128x256x64 c2x1 cooperative hooked+regsource'       the source read into the accumulators at the epilogue
#                                                        (call 5's, now with two row pointers and immediate offsets)
#   '128x256x64 c2x1 cooperative hooked+regsource-prefetch'  the same, loaded during the next tile's mainloop where
#                                                        its signal is up (a CTA's first tile still at its epilogue)
# Static facts (nineteenth session, Release SASS, PERF.md): per tile per consumer thread the source adds
# ~350 epilogue instructions (LDSM 16, bf16 unpacks ~140, FADD 128, ~105 register moves from the per-tile
# zero select) and one mbarrier wait per sub-tile whose LDSM feeds the adds at once.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=build-gpu
t0=$SECONDS
case "${1:-time}" in
time)
  # -lineinfo does not change the code; it lets the profile call map SASS to source lines.
  [ -f $B/CMakeCache.txt ] || cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-lineinfo \
    > "$OUT/configure.log" 2>&1
  OUT=$OUT/session bash scripts/gpu_session.sh build gpu | tail -n 12
  echo "built and tested at $((SECONDS - t0)) s"
  for r in 1 2; do
    for cfg in '128x256x64 c2x1 cooperative' '128x256x64 c2x1 cooperative hooked+source' \
               '128x256x32 c2x1 cooperative' '128x256x32 c2x1 cooperative hooked+source8' \
               '128x256x32 c2x1 cooperative hooked+source-noreuse' \
               '128x256x32 c2x1 cooperative hooked+source-noreuse-delay' \
               '128x256x64 c2x1 cooperative hooked+regsource' '128x256x64 c2x1 cooperative hooked+regsource-prefetch'; do
      hook=(--hook wait_source_rows --any-order); [[ $cfg == *hooked* ]] || hook=()
      $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout kn --samples 15 \
        --shapes '1024,8192,4096;2048,8192,4096' "${hook[@]}" --config "$cfg" 2>&1 |
        grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r $cfg: /"
    done
  done | tee "$OUT/gemm_alone.txt"
  echo "done at $((SECONDS - t0)) s" ;;
profile)
  O=$OUT/profile; mkdir -p "$O"
  # Forced full names launch no tuning candidates. --no-hold: the bench's hold kernel times out under ncu.
  S="--clock-control none --kernel-name device_kernel --launch-skip 4 --launch-count 1 --set full --import-source yes"
  run() {  # name, weft-bench arguments...
    local name=$1; shift
    $B/weftrun -n 1 --timeout 300 -- ncu $S -o "$O/$name" $B/weft-bench gemm --b-layout kn --shapes 1024,8192,4096 \
      --samples 2 --no-hold "$@" > "$O/$name.log" 2>&1
    echo "$name: rc=$? at $((SECONDS - t0)) s"
    ncu --import "$O/$name.ncu-rep" --page details > "$O/${name}_details.txt" 2>&1
    ncu --import "$O/$name.ncu-rep" --page source --csv --print-source sass > "$O/${name}_sass.csv" 2>&1
  }
  H=(--hook wait_source_rows --any-order)
  run plain --config '128x256x64 c2x1 cooperative, swizzle 2 along M'
  run source "${H[@]}" --config '128x256x64 c2x1 cooperative hooked+source, swizzle 2 along M'
  run noreuse "${H[@]}" --config '128x256x32 c2x1 cooperative hooked+source-noreuse, swizzle 2 along M'
  run prefetch "${H[@]}" --config '128x256x64 c2x1 cooperative hooked+regsource-prefetch, swizzle 2 along M'
  grep -E "Duration|Executed Ipc|Issue Slots|Registers Per|Shared Memory Configuration Size" "$O"/*_details.txt
  (cd "$OUT" && tar czf profile.tgz profile && rm -rf profile) ;;
rs)
  # The ring's steps that add a source: the TMA epilogue (main's), or the source in registers at the epilogue
  # or ahead of it (WEFT_RS_SOURCE, src/ops/gemm_rs.cpp's cooperative_step); 2 rounds, interleaved.
  OUT=$OUT/session AB_ROUNDS=2 AB_ENVS='WEFT_RS_SOURCE=smem;WEFT_RS_SOURCE=prefetch;WEFT_RS_SOURCE=registers' \
    AB_SPECS='gemm_rs --m 2048,4096,8192 --n 8192 --k 8192 --variant fused --way plain_first --samples 15' \
    bash scripts/gpu_session.sh build gpu ab | tail -n 30 ;;
*) echo "usage: $0 time|profile|rs"; exit 2 ;;
esac
