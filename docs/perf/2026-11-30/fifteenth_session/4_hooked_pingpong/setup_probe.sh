#!/bin/bash
# Recreates the fifteenth session's hooked-pingpong probe under .deps/ (ignored; it travels with carry [".deps"]):
#   .deps/source_probe2/  the probe's sources and build scripts (this directory)
#   .deps/hookvar/  include/ and src/gemm/ with probe_all.patch applied: tile_hooks.cuh variants chosen by -DPROBE_* macros
#     PROBE_TRIVIAL (hooked() returns the tile), PROBE_NO_WAIT (rotation only), PROBE_NO_LEAVE, PROBE_NO_WAITS,
#     PROBE_INLINE (wait_flag inline), PROBE_NOCALL (a wait with no call: report stored inline, then trap),
#     PROBE_FAST (inline fast path before the out-of-line wait), PROBE_DIV32, PROBE_NO_TIMING, PROBE_SPLIT (the
#     consumers' copy without wait code: advance_to_next_work overloads)
# The .deps/cutlass headers come from scripts/setup.sh. Then, on a 1-GPU machine (the combination no call + no count-out
# + split: no C7507 and no spill in ptxas -v; not measured yet):
#   ROUNDS=3 bash .deps/source_probe2/build_run_variants.sh asis "clean=-DPROBE_NOCALL -DPROBE_NO_LEAVE -DPROBE_SPLIT"
set -eu
cd "$(dirname "$0")"
ROOT=$(git rev-parse --show-toplevel)
mkdir -p "$ROOT/.deps/source_probe2"
cp k_*.cu main.cu main_hook.cu build_run_variants.sh "$ROOT/.deps/source_probe2/"
rm -rf "$ROOT/.deps/hookvar" && mkdir -p "$ROOT/.deps/hookvar/src"
cp -r "$ROOT/include" "$ROOT/.deps/hookvar/include"
cp -r "$ROOT/src/gemm" "$ROOT/.deps/hookvar/src/gemm"
patch -s "$ROOT/.deps/hookvar/src/gemm/tile_hooks.cuh" < probe_all.patch
echo "probe ready: $ROOT/.deps/source_probe2 (tile_hooks variants in $ROOT/.deps/hookvar)"
