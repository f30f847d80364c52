#!/bin/bash
# 16th session call 1: the hooked-pingpong probe's unmeasured combination, plus nowait bound, and SASS of asis/nowait/clean.
set -u
export PATH="$PATH:/usr/local/cuda/bin"
cd .deps/source_probe2
MAIN=main_hook.cu ROUNDS=3 bash build_run_variants.sh asis nowait=-DPROBE_NO_WAIT "clean=-DPROBE_NOCALL -DPROBE_NO_LEAVE -DPROBE_SPLIT" 2>&1 | tee $OUT/probe.txt
for v in asis nowait clean; do cuobjdump -sass v_$v/k_hooked.o > $OUT/sass_$v.txt 2>&1; done
ls -la $OUT
