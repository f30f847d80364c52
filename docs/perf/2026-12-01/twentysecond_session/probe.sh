#!/bin/bash
# 22nd session, carry [".deps"]: GemmHook::add_rows (the epilogue that adds rows onto a partial sum by TMA
# reduce-add) and GemmRs's FusedWay::one_launch_add.
#   bash docs/perf/2026-12-01/twentysecond_session/probe.sh gemm   # 1 x H200 (~8 min)
#   bash docs/perf/2026-12-01/twentysecond_session/probe.sh rs     # 2 x H200 (~9 min)
# gemm: build, GPU tests at 1 rank (GemmAddRows: waits, one rounding, bitwise), then the GEMM alone on one GPU
#   at GEMM+ReduceScatter's per-rank shapes at 2 ranks (M x 8192 x K/2, M = 2048 / 4096 / 8192, K = 8192 /
#   28672), B [N, K], 2 rounds, each against cuBLAS in the same process: the one-launch-adding GEMM (its lower
#   half of the rows added onto zeros, nothing waited for), the plain 128x256 c2x1 cooperative kernel it is
#   built from, and the tuner's plain pick. At 2 ranks the operator's time is this GEMM's (its communication
#   runs under it), and the ideal is the faster of the plain GEMMs: the "add" row's ratio to cuBLAS is the
#   operator's ratio to ideal before anything is sent.
# rs: build, GPU tests at 1 and 2 ranks, then GemmRs and GemmAr at K = 8192 and 28672, M = 2048 / 4096 /
#   8192, fused one_launch_add against plain_first (the way the acceptance picked so far), 2 rounds, --check.
#   The acceptance is a call of its own after it: bash docs/perf/2026-12-01/eighteenth_session/2_acceptance/probe36.sh
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=build-gpu
t0=$SECONDS
OUT=$OUT/session bash scripts/gpu_session.sh build gpu | tail -n 14
echo "built and tested at $((SECONDS - t0)) s"
SHAPES='2048,8192,4096;4096,8192,4096;8192,8192,4096;2048,8192,14336;4096,8192,14336;8192,8192,14336'
case "${1:-gemm}" in
gemm)
  for r in 1 2; do
    for spec in 'add_rows|' 'none|128x256x64 c2x1 cooperative' 'none|'; do
      hook=${spec%%|*} cfg=${spec#*|}
      $B/weftrun -n 1 --timeout 200 -- $B/weft-bench gemm --b-layout nk --samples 15 --shapes "$SHAPES" \
        --hook "$hook" ${cfg:+--config "$cfg"} 2>&1 |
        grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r $hook ${cfg:-tuned}: /"
    done
    echo "round $r done at $((SECONDS - t0)) s"
  done | tee "$OUT/gemm_alone.txt" ;;
rs)
  OUT=$OUT/ab AB_ROUNDS=2 AB_ENVS='WEFT_UNUSED=0' \
    AB_SPECS='gemm_rs --m 2048,4096,8192 --n 8192 --k 8192,28672 --variant fused --way one_launch_add --samples 15 --check;gemm_rs --m 2048,4096,8192 --n 8192 --k 8192,28672 --variant fused --way plain_first --samples 15 --check;gemm_ar --m 2048,4096 --n 8192 --k 8192 --variant fused --way one_launch_add --samples 15 --check' \
    bash scripts/gpu_session.sh ab | tail -n 30 ;;
*) echo "usage: $0 gemm|rs"; exit 2 ;;
esac
echo "done at $((SECONDS - t0)) s"
