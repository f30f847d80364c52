#!/bin/bash
# 21st session, carry [".deps"], on main with
#   git apply docs/perf/2026-12-01/twentyfirst_session/2_k32_ab/k32_steps.patch   (branch k32-steps):
#   bash docs/perf/2026-12-01/twentyfirst_session/2_k32_ab/probe.sh gemm   # 1 x H200: call 2 (~3.5 min)
#   bash docs/perf/2026-12-01/twentyfirst_session/2_k32_ab/probe.sh pair   # 1 x H200 (~4 min)
#   bash docs/perf/2026-12-01/twentyfirst_session/2_k32_ab/probe.sh rs     # 2 x H200 (~7 min)
# gemm: build, GPU tests at 1 rank, then the GEMM alone on one GPU, 2 rounds: 1024 / 2048 x 8192 x 4096,
#   B [N, K], each ring-step kernel forced by name, every row adding a source (--hook wait_source_rows
#   --any-order), and the plain K64 kernel. Contenders: main's K64 step (4 of 8 source sub-tiles held), a K32
#   one holding all 8 (source8), a K32 one storing D from slots of its own (noreuse).
# pair: build, GPU tests at 1 rank, then weft-pdl-pair-probe (tools/pdl_pair_probe.cu) twice at the ring's
#   step shapes for M = 2048 / 4096 / 8192 (1024 / 2048 / 4096 x 8192 x 4096): the plain first step then the
#   source step, the second launched the ordinary way or programmatically, against the whole GEMM.
# rs: build, GPU tests at 1 and 2 ranks, then GemmRs at K = 8192, M = 2048 / 4096 / 8192, the plain-first
#   ring, interleaved, 2 rounds, --check: main's step (WEFT_RS_SOURCE=smem), source8, and main's step
#   launched under the plain first step's tail (WEFT_RS_PDL=1: programmatic dependent launch, the first step
#   releasing it after each CTA's last mainloop, the source step not waiting for it).
set -u
export PATH="$PATH:/usr/local/cuda/bin" NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=build-gpu
t0=$SECONDS
OUT=$OUT/session bash scripts/gpu_session.sh build gpu | tail -n 12
echo "built and tested at $((SECONDS - t0)) s"
case "${1:-gemm}" in
gemm)
  for r in 1 2; do
    for cfg in '128x256x64 c2x1 cooperative' '128x256x64 c2x1 cooperative hooked+source' \
               '128x256x32 c2x1 cooperative hooked+source8' '128x256x32 c2x1 cooperative hooked+source-noreuse'; do
      hook=(--hook wait_source_rows --any-order); [[ $cfg == *hooked* ]] || hook=()
      $B/weftrun -n 1 --timeout 120 -- $B/weft-bench gemm --b-layout nk --samples 15 \
        --shapes '1024,8192,4096;2048,8192,4096' "${hook[@]}" --config "$cfg" 2>&1 |
        grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ " | sed "s/^/$r $cfg: /"
    done
  done | tee "$OUT/gemm_alone.txt" ;;
pair)
  for r in 1 2; do
    for rows in 1024 2048 4096; do
      echo "### round $r, step rows $rows"
      $B/weft-pdl-pair-probe $rows 8192 4096 2>&1 | tail -n 8
    done
  done | tee "$OUT/pair.txt" ;;
rs)
  OUT=$OUT/ab AB_ROUNDS=2 AB_ENVS='WEFT_RS_SOURCE=smem;WEFT_RS_SOURCE=source8;WEFT_RS_PDL=1' \
    AB_SPECS='gemm_rs --m 2048,4096,8192 --n 8192 --k 8192 --variant fused --way plain_first --samples 15 --check' \
    bash scripts/gpu_session.sh ab | tail -n 30 ;;
*) echo "usage: $0 gemm|rs"; exit 2 ;;
esac
echo "done at $((SECONDS - t0)) s"
