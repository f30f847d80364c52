#!/bin/bash
# 16th session call 2 (1 GPU): main (old, waits in the scheduler) against this tree (new, waits in the load
# collectives) against the bound (nowait: the scheduler only rotates), weft's pingpong 128x128 c1x2, nothing waited for.
set -u
export PATH="$PATH:/usr/local/cuda/bin"
cd .deps/source_probe2
MAIN=main_hook.cu ROUNDS=3 bash build_run_variants.sh old@../oldtree new@../.. nowait=-DPROBE_NO_WAIT 2>&1 | tee $OUT/probe.txt
MAIN=main.cu ROUNDS=2 bash build_run_variants.sh old@../oldtree new@../.. 2>&1 | tee $OUT/probe_source.txt
