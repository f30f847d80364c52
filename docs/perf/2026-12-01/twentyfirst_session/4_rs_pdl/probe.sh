#!/bin/bash
# 21st session, carry [".deps"], branch rs-pdl (or main with 4_rs_pdl/rs_pdl.patch applied):
#   bash docs/perf/2026-12-01/twentyfirst_session/4_rs_pdl/probe.sh pair   # 1 x H200 (~4 min)
#   bash docs/perf/2026-12-01/twentyfirst_session/4_rs_pdl/probe.sh ab     # 2 x H200 (~8 min)
# The plain-first ring's second step launched programmatically (WEFT_PDL=1, the default on the branch)
# against plain stream order (WEFT_PDL=0; GemmRs / GemmAr launch no other weft kernel on their fused paths).
# Both: build, GPU tests (at 1 rank, and at 2 where there are 2 GPUs: the 1,000-run bitwise test covers
# the programmatic step). pair: weft-pdl-pair-probe at the ring's step shapes for M = 2048 / 4096, 2 rounds.
# ab: GemmRs and GemmAr at K = 8192, M = 2048 / 4096 / 8192, plain first step forced, interleaved,
# 2 rounds, --check.
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
t0=$SECONDS
OUT=$OUT/session bash scripts/gpu_session.sh build gpu | tail -n 12
echo "built and tested at $((SECONDS - t0)) s"
case "${1:-ab}" in
pair)
  for r in 1 2; do
    for rows in 1024 2048; do
      echo "### round $r, step rows $rows"
      build-gpu/weft-pdl-pair-probe $rows 8192 4096 2>&1 | tail -n 8
    done
  done | tee "$OUT/pair.txt" ;;
ab)
  OUT=$OUT/ab AB_ROUNDS=2 AB_ENVS='WEFT_PDL=1;WEFT_PDL=0' \
    AB_SPECS='gemm_rs --m 2048,4096,8192 --n 8192 --k 8192 --variant fused --way plain_first --samples 15 --check;gemm_ar --m 2048,4096,8192 --n 8192 --k 8192 --variant fused --way plain_first --samples 15 --check' \
    bash scripts/gpu_session.sh ab | tail -n 30 ;;
*) echo "usage: $0 pair|ab"; exit 2 ;;
esac
echo "done at $((SECONDS - t0)) s"
