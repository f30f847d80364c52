#!/bin/bash
# 21st session, 2 x H200 (1 x H200 runs stages 1-2 only), carry [".deps"], on main with
#   git apply docs/perf/2026-12-01/twentyfirst_session/2_k32_ab/k32_steps.patch   (branch k32-steps):
#   bash docs/perf/2026-12-01/twentyfirst_session/2_k32_ab/probe.sh
# The ring step that adds a source at K32 (all 8 source sub-tiles held: source8; or D stored from slots of its
# own: noreuse) against main's K64 step (smem), B [N, K] as the overlap benchmarks use it:
#   1. build, GPU tests at 1 and 2 ranks;
#   2. GEMM alone on one GPU, 2 rounds: 1024 / 2048 x 8192 x 4096, each step kernel forced by name, every row
#      adding a source (--hook wait_source_rows --any-order), and the plain K64 kernel;
#   3. GemmRs at K = 8192, M = 2048 / 4096 / 8192, the plain-first ring, WEFT_RS_SOURCE = smem / source8 /
#      noreuse interleaved, 2 rounds, --check.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=build-gpu
t0=$SECONDS
OUT=$OUT/session bash scripts/gpu_session.sh build gpu | tail -n 12
echo "built and tested at $((SECONDS - t0)) s"
for r in 1 2; do
  for cfg in '128x256x64 c2x1 cooperative' '128x256x64 c2x1 cooperative hooked+source' \
             '128x256x32 c2x1 cooperative hooked+source8' '128x256x32 c2x1 cooperative hooked+source-noreuse'; do
    hook=(--hook wait_source_rows --any-order); [[ $cfg == *hooked* ]] || hook=()
    $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout nk --samples 15 \
      --shapes '1024,8192,4096;2048,8192,4096' "${hook[@]}" --config "$cfg" 2>&1 |
      grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r $cfg: /"
  done
done | tee "$OUT/gemm_alone.txt"
echo "GEMM alone done at $((SECONDS - t0)) s"
OUT=$OUT/session AB_ROUNDS=2 AB_ENVS='WEFT_RS_SOURCE=smem;WEFT_RS_SOURCE=source8;WEFT_RS_SOURCE=noreuse' \
  AB_SPECS='gemm_rs --m 2048,4096,8192 --n 8192 --k 8192 --variant fused --way plain_first --samples 15 --check' \
  bash scripts/gpu_session.sh ab | tail -n 30
echo "done at $((SECONDS - t0)) s"
