#!/bin/bash
# Builds the hooked-pingpong probe once per variant of weft's GEMM headers, then runs each build in turn, ROUNDS times.
#   bash build_run_variants.sh VARIANT...      VARIANT = NAME[@ROOT][=DEFINES]
#     ROOT: a tree with include/ and src/gemm/ (default ../hookvar: src/gemm with probe_all.patch, setup_probe.sh);
#           ../.. is main itself
#     DEFINES: the -DPROBE_* macros of probe_all.patch that pick the variant of tile_hooks.cuh
#   MAIN=main.cu (default: plain, source visitor, hooked, hooked + source visitor, by rows) or main_hook.cu (plain, hooked)
#   ROUNDS=2 (default)
# Each build prints its hooked kernels' ptxas verdict (C7507, registers, spills); every probe line starts "round name".
set -eu
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/cuda/bin"
MAIN=${MAIN:-main.cu}
ROUNDS=${ROUNDS:-2}
KERNELS="k_plain.cu k_hooked.cu"
[ "$MAIN" = main.cu ] && KERNELS="$KERNELS k_evt.cu k_hooked_evt.cu"
C="-std=c++20 --expt-relaxed-constexpr -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -I../cutlass/include -I../cutlass/util/include"
names=()
t0=$SECONDS
for spec in "$@"; do
  head=${spec%%=*}; defines=""; [ "$head" != "$spec" ] && defines=${spec#*=}
  name=${head%%@*}; root=../hookvar; [ "$name" != "$head" ] && root=${head#*@}
  names+=("$name")
  mkdir -p "v_$name"
  for f in $KERNELS $MAIN; do
    # shellcheck disable=SC2086  # the defines are a word list
    (nvcc $C -I"$root/include" -I"$root/src/gemm" $defines -Xptxas -v -c $f -o "v_$name/${f%.cu}.o" > "v_$name/${f%.cu}.log" 2>&1 ||
      grep -v C7507 "v_$name/${f%.cu}.log" | head -20) &
  done
done
wait
for name in "${names[@]}"; do
  for f in v_$name/k_hooked*.log; do
    echo "$f: $(grep -c C7507 "$f") C7507, $(grep -oE 'Used [0-9]+ registers' "$f" | sort -u | tr '\n' ' ')$(grep -oE '[0-9]+ bytes spill stores' "$f" | sort -u | tr '\n' ' ')"
  done
  nvcc $C "v_$name"/*.o -lcuda -o "v_$name/probe"
done
echo "built in $((SECONDS - t0)) s"
for r in $(seq "$ROUNDS"); do
  for name in "${names[@]}"; do "./v_$name/probe" | sed "s/^ */$r $name /"; done
done
