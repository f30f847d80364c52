#!/bin/bash
# The adding kernel's TMA instructions, on a machine with no GPU (twenty-second session).
#   bash docs/perf/2026-12-01/twentysecond_session/tma_ops.sh [CONFIG]
# CONFIG (default config_bf16_bf16_nk_128x256x64_c2x1_cooperative_hooked_add): a file under src/gemm/configs
# without .cu. Compiles it as the Release build does, counts its UTMA* instructions, and prints the code
# around the first reduce-add (UTMAREDG). ptxas wraps CuTe's reduce-add in a loop over the warp's active
# lanes (ELECT ... BRA.U.ANY), one UTMAREDG per lane; with TmaReduceAddOneLane only lane 0 takes part
# (P4 = lane == 0), so a warp issues one. The plain stores (UTMASTG) are issued once per warp, no loop.
# cuobjdump comes from the pip wheel nvidia-cuda-cuobjdump, unpacked under $TOOLS (default /tmp/objd).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
CFG=${1:-config_bf16_bf16_nk_128x256x64_c2x1_cooperative_hooked_add}
TOOLS=${TOOLS:-/tmp/objd}; BIN=$TOOLS/x/nvidia/cu13/bin
if [ ! -x "$BIN/cuobjdump" ]; then
  mkdir -p "$TOOLS"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$TOOLS" nvidia-cuda-cuobjdump
  for w in "$TOOLS"/*.whl; do python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$TOOLS/x"; done
  chmod +x "$BIN"/*
fi
W=${WORK:-/tmp/tma_ops}; mkdir -p "$W"
nvcc -c -gencode=arch=compute_90a,code=sm_90a -std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG \
  -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -Isrc/gemm -Iinclude -Isrc -I.deps/cutlass/include \
  -I.deps/cutlass/util/include "src/gemm/configs/$CFG.cu" -o "$W/$CFG.o" 2>"$W/$CFG.nvcc.log" || { cat "$W/$CFG.nvcc.log"; exit 1; }
"$BIN/cuobjdump" -sass "$W/$CFG.o" | sed 's|/\* 0x[0-9a-f]* \*/||' | grep -v '^ *$' > "$W/$CFG.sass"
echo "TMA instructions in $CFG:"
grep -oE "(@!?U?P[0-9T] )?UTMA[A-Z]+(\.[A-Z0-9]+)*" "$W/$CFG.sass" | sort | uniq -c
n=$(grep -n "UTMAREDG" "$W/$CFG.sass" | head -1 | cut -d: -f1)
[ -n "$n" ] && { echo "around the first reduce-add:"; sed -n "$((n - 10)),$((n + 4))p" "$W/$CFG.sass"; }
