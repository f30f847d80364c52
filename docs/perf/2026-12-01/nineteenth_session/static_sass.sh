#!/bin/bash
# The nineteenth session's static look at a GEMM configuration's SASS, on a machine with no GPU.
#   bash docs/perf/2026-12-01/nineteenth_session/static_sass.sh CONFIG [LINE ...]
# CONFIG: a file name under src/gemm/configs without .cu. Compiles it as CMake's Release build does
# (-O3 -DNDEBUG: without NDEBUG CuTe's asserts serialise every wgmma, ptxas C7510) plus -lineinfo, prints
# ptxas's registers and spills, disassembles it with line information, and runs sass_lines.py on it.
# cuobjdump and nvdisasm are not in this machine's toolkit: they come from the pip wheels
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm, unpacked under $TOOLS (default /tmp/objd).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
CFG=$1; shift
HERE=docs/perf/2026-12-01/nineteenth_session
TOOLS=${TOOLS:-/tmp/objd}; BIN=$TOOLS/x/nvidia/cu13/bin
if [ ! -x "$BIN/nvdisasm" ]; then
  mkdir -p "$TOOLS"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$TOOLS" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  for w in "$TOOLS"/*.whl; do python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$TOOLS/x"; done
  chmod +x "$BIN"/*
fi
W=${WORK:-/tmp/sass}; mkdir -p "$W/$CFG"
nvcc -c -gencode=arch=compute_90a,code=sm_90a -std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG \
  -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -lineinfo -Xptxas -v -Isrc/gemm -Iinclude -Isrc -I.deps/cutlass/include \
  -I.deps/cutlass/util/include "src/gemm/configs/$CFG.cu" -o "$W/$CFG/$CFG.o" 2>&1 | grep -E "registers|spill|C75"
(cd "$W/$CFG" && "$BIN/cuobjdump" -xelf all "$CFG.o" > /dev/null)
"$BIN/nvdisasm" -gi -c "$W/$CFG"/*.cubin > "$W/$CFG/$CFG.gi.sass"
python3 "$HERE/sass_lines.py" "$W/$CFG/$CFG.gi.sass" "$@"
