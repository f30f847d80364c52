#!/usr/bin/env bash
# One call on a GPU machine: build, every GPU test, the examples and the
# benchmarks, logs under $OUT, a short table last. Nothing is fetched: the
# machine reaches no registry, so .deps/ (nvml.h, GoogleTest sources) travels
# with the working tree (device tool: carry [".deps"]; with ".carry" too where
# scripts/prebuild.sh packed the programs on a machine without a GPU, the build
# stage takes them instead of compiling).
#
#   bash scripts/gpu_session.sh [stage ...]     stages: build cpu gpu launchers python e2e shared gemm hooks cublas overlap chunks trace waits probe soak bench pdl tune ab decode ep moe grouped two_gpu
#   (OVERLAP_ARGS, OVERLAP_OPS, CHUNK_OPS, CHUNK_COUNTS, CHUNK_ARGS narrow the overlap and chunks stages;
#    GROUPED_ROUTINGS, GROUPED_ARGS, GROUPED_CONFIGS the grouped stage's routings, extra weft-bench
#    arguments and the tiles it also times forced, ';'-separated;
#    AB_ENVS, AB_SPECS, AB_ROUNDS set the ab stage's settings, runs and rounds;
#    MOE_ROUTINGS, MOE_WORLDS the moe stage's routings, default "uniform zipf", and world sizes, default 1;
#    EP_TEST_WORLDS the ep stage's world sizes for the EP GPU tests, default "1 2 4 8";
#    DECODE_DTYPES, DECODE_ARGS, DECODE_SWEEP_ARGS the decode stage's types, weft-bench decode's extra
#    arguments, and its --sweep's (e.g. "--dtype fp16" or "--cases ...");
#    PYTHON_WORLDS the python stage's multi-rank world sizes, default "2 4", and PYTHON_WAIT_S its
#    ranks' store and device wait bounds, default 300 s: above a rank's torch.compile time;
#    GPU_TESTS_PARTS, SUITE_WORLDS, NVSHMEM_WORLDS, SUITE_FILTER the gpu stage's parts of scripts/gpu_tests.sh,
#    world sizes and suite cases;
#    TWO_GPU_PARTS the two_gpu stage's parts, default "overlap block ep moe decode collectives":
#    two calls of a few parts each keep every call under the device tool's 600 s)
#                                               (default: build cpu gpu bench; gpu runs scripts/gpu_tests.sh:
#                                                the suite at world 1, 2, 4, 8, provoked hangs, examples, launcher)
#
# What comes back (the device tool returns at most 8 files): summary.txt, the
# sweep's CSVs and plots, and logs.tgz with every log and raw JSON line.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/weft-out}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
BUILD=${WEFT_BUILD_DIR:-build-gpu}
STAGES=${*:-build cpu gpu bench}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)  # grep -c prints 0 itself where none
declare -a SUMMARY
note() { SUMMARY+=("$(printf '%-28s %s' "$1" "$2")"); echo "### $1: $2"; }
has() { [[ " $STAGES " == *" $1 "* ]]; }
run_logged() {  # name, log, command...
  local name=$1 log=$2; shift 2
  local t0=$SECONDS
  "$@" >"$OUT/$log" 2>&1
  local rc=$?
  note "$name" "rc=$rc ($((SECONDS - t0)) s) -> $log"
  return $rc
}

{ nvidia-smi; nvidia-smi topo -m; } >"$OUT/machine.txt" 2>&1
note "machine" "$GPUS GPU(s): $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
# Each GPU's clocks, power and clock-event reasons every 200 ms, for the whole
# call: a rank that runs slower shows here (read only; clocks are never set).
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
  --format=csv,noheader,nounits -lms 200 >"$OUT/clocks.log" 2>&1 &
CLOCKS_PID=$!

# Programs built on a machine without a GPU (scripts/prebuild.sh), carried in
# .carry/: used where they were built from this very tree and start here;
# otherwise the build below, as if they were absent. Unpacked into $BUILD with
# their SOURCE_STAMP, so a later call on the same machine (no build stage)
# takes them too. The NCCL, cuBLAS and NVSHMEM this image has are found where
# python3's wheels put them.
PREBUILT=.carry/prebuilt.tar.xz
PREBUILT_USED=0
prebuilt_env() {
  local libs
  libs=$(python3 -c 'import glob, os, nvidia
print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/*/lib/lib*.so*")})))' 2>/dev/null)
  export LD_LIBRARY_PATH="${libs:+$libs:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local d
  for d in ${libs//:/ }; do  # NVSHMEM's host library, from the same wheels
    if [ -z "${WEFT_NVSHMEM_LIBRARY:-}" ] && [ -f "$d/libnvshmem_host.so.3" ]; then
      export WEFT_NVSHMEM_LIBRARY=$d/libnvshmem_host.so.3
    fi
  done
  PREBUILT_USED=1
}
use_prebuilt() {
  local stamp packed
  stamp=$(bash scripts/prebuild.sh --stamp)
  if [ -f "$BUILD/SOURCE_STAMP" ]; then  # unpacked by an earlier call on this machine
    if [ "$(cat "$BUILD/SOURCE_STAMP")" = "$stamp" ]; then
      prebuilt_env
      note "prebuilt programs" "used, as unpacked before: sources $stamp"
      return 0
    fi
    rm -rf "$BUILD"  # built from other sources: not a build tree to continue
  fi
  [ -f "$PREBUILT" ] && [ ! -e "$BUILD" ] || return 1
  packed=$(tar -xOJf "$PREBUILT" ./SOURCE_STAMP)
  if [ "$stamp" != "$packed" ]; then note "prebuilt programs" "not used: built from sources $packed, this tree is $stamp"; return 1; fi
  mkdir -p "$BUILD" && tar -xJf "$PREBUILT" -C "$BUILD"
  prebuilt_env
  ldd "$BUILD"/weft-* "$BUILD"/tests/weft_* >"$OUT/prebuilt.log" 2>&1
  timeout 120 "$BUILD/weftrun" -n 1 -- "$BUILD/weft-info" >>"$OUT/prebuilt.log" 2>&1
  local rc=$?
  if [ "$rc" != 0 ] || grep -q 'not found' "$OUT/prebuilt.log"; then
    note "prebuilt programs" "not used: they do not start on this image (weft-info rc=$rc, prebuilt.log); building"
    rm -rf "$BUILD"
    PREBUILT_USED=0
    return 1
  fi
  note "prebuilt programs" "used: sources $stamp, $(grep -E '^WEFT_GEMM_KERNELS:' "$BUILD/CMakeCache.txt"), NVSHMEM ${WEFT_NVSHMEM_LIBRARY:-none}"
}
# A call without the build stage, after one that unpacked them: their libraries.
if ! has build && [ -f "$BUILD/SOURCE_STAMP" ]; then prebuilt_env; fi

if has build && use_prebuilt; then
  STAGES=${STAGES/build/}  # nothing left to compile: the stages below take the carried programs
elif has build; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    # WEFT_CMAKE_ARGS adds settings, e.g. -DWEFT_GEMM_KERNELS=subset (CI's kernel table) for a shorter build
    # (154 s against 259; three GPU tests then fail for want of configurations outside the subset:
    # GroupedGemm.BothTypesBothLayoutsAndEveryConfiguration and MoeTp.OneTokenPerRankAndFp16 (grouped),
    # Gemm.ShapesOfTheTensorParallelBenchmarksAreRight (fp16 in, fp32 out)).
    # shellcheck disable=SC2086
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${WEFT_CMAKE_ARGS:-} >"$OUT/configure.log" 2>&1 ||
      { note configure "FAILED"; tail -n 30 "$OUT/configure.log"; }
  fi
  run_logged build build.log cmake --build "$BUILD" -j "$(nproc)" || tail -n 40 "$OUT/build.log"
fi

if has cpu && [ "$PREBUILT_USED" = 1 ]; then
  note "cpu tests" "not run: the carried programs come without CTest's files (CI runs the CPU tests)"
elif has cpu; then
  run_logged "cpu tests" cpu_tests.log ctest --test-dir "$BUILD" -L cpu --output-on-failure
fi

if has gpu; then
  "$BUILD/weftrun" -n "$GPUS" -- "$BUILD/weft-info" >"$OUT/weft_info.txt" 2>&1
  note "weft-info" "rc=$? -> weft_info.txt"
  # The GPU matrix (scripts/gpu_tests.sh): the suite at world sizes 1, 2, 4, 8
  # (ranks sharing a GPU where there are fewer), provoked hangs, the examples,
  # weftrun stopping a job, no MPS daemon left behind.
  mkdir -p "$OUT/gpu_tests"
  t0=$SECONDS
  bash scripts/gpu_tests.sh "$BUILD" "$OUT/gpu_tests" | tee "$OUT/gpu_tests.txt"
  note "gpu matrix" "rc=${PIPESTATUS[0]} ($((SECONDS - t0)) s): $(tail -n 1 "$OUT/gpu_tests.txt")"
  if [ "$GPUS" -ge 2 ]; then
    # The tuning cache across processes: the second process takes every GEMM
    # choice from the file, launching kernels no tuning loaded (a hang once).
    rm -f "$OUT/tune.cache"
    for pass in 1 2; do
      WEFT_TUNE_CACHE="$OUT/tune.cache" WEFT_LOG_LEVEL=debug "$BUILD/weftrun" -n 2 --timeout 120 -- \
        "$BUILD/weft-bench" gemm_rs --m 4096 --n 8192 --k 8192 --samples 3 --check >"$OUT/tune_cache_$pass.log" 2>&1
      rc=$?
      note "tuning cache, process $pass" "rc=$rc, $(grep -c 'from the tuning cache' "$OUT/tune_cache_$pass.log") GEMM choices from the file, check: $(grep -oE '\| (ok|FAIL)' "$OUT/tune_cache_$pass.log" | head -n1)"
    done
  fi
fi

if has launchers; then  # weft programs under torchrun with no WEFT_* variable; a project built against the installed weft
  if python3 -c 'import torch' 2>/dev/null; then
    run_logged "torchrun, 1 rank" torchrun_1.log python3 -m torch.distributed.run --standalone --no-python \
      --nproc_per_node 1 "$BUILD/weft-info"
    if [ "$GPUS" -ge 2 ]; then
      run_logged "torchrun, 2 ranks" torchrun_2.log python3 -m torch.distributed.run --standalone --no-python \
        --nproc_per_node 2 "$BUILD/weft-info"
    elif command -v nvidia-cuda-mps-control >/dev/null; then
      # Two ranks on one GPU share it wherever an MPS daemon runs: one of our own for this step.
      mps_dir=$(mktemp -d)
      mkdir -p "$mps_dir/pipe" "$mps_dir/log"
      CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log nvidia-cuda-mps-control -d
      CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe run_logged "torchrun, 2 ranks sharing a GPU" torchrun_2.log \
        python3 -m torch.distributed.run --standalone --no-python --nproc_per_node 2 "$BUILD/weft-info"
      echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe nvidia-cuda-mps-control
      sleep 1
      rm -rf "$mps_dir"
    fi
    grep -E "job:|SMs|shared" "$OUT"/torchrun_*.log | head -n 12
  else
    note "torchrun" "not run: python3 has no torch here"
  fi
  if [ "$PREBUILT_USED" = 1 ]; then
    note "installed package" "not run: cmake --install needs the build tree, which the carried programs lack"
  elif [ -f scripts/check_install.sh ]; then
    WEFT_BUILD_DIR="$BUILD" run_logged "installed package, example project" check_install.log bash scripts/check_install.sh
    tail -n 5 "$OUT/check_install.log"
  fi
fi

if has python; then  # the Python package, installed from .deps without network; its pytest at world 1, 2 and 4
  mkdir -p "$OUT/python"
  # Build and install against $BUILD/libweft.a, then the CPU tests and the GPU tests as one rank.
  WEFT_PYTHON_EXE=python3 run_logged "python: install + world 1" python_world1.log \
    bash scripts/python_tests.sh "$BUILD" "$OUT/python/world1.xml"
  tail -n 3 "$OUT/python_world1.log"
  site="$PWD/$BUILD/python-site"
  if grep -q "Segmentation fault" "$OUT/python_world1.log"; then
    # A crash inside the extension: weft.init alone, with a SIGSEGV handler
    # preloaded that prints the native frames (the image has no gdb), each
    # frame of a weft library then resolved to its function and line.
    cat >/tmp/weft_segv.c <<'C'
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>
static void on_segv(int sig) {
  void* frames[64];
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) { signal(SIGSEGV, on_segv); }
C
    cat >/tmp/weft_init_only.py <<'PY'
import torch, torch.distributed as dist, weft
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
print("torch", torch.__version__, "cuda", torch.version.cuda, flush=True)
weft.init(dist.group.WORLD, heap_size="256M")
print("weft.init ok", weft.info(), flush=True)
weft.shutdown()
PY
    gcc -shared -fPIC -O0 -g -o /tmp/weft_segv.so /tmp/weft_segv.c >"$OUT/python_crash.log" 2>&1
    LD_PRELOAD=/tmp/weft_segv.so WEFT_LOG_LEVEL=debug PYTHONPATH="$site" timeout 120 python3 /tmp/weft_init_only.py \
      >>"$OUT/python_crash.log" 2>&1
    echo "rc=$?" >>"$OUT/python_crash.log"
    grep -oE '[^ (]*_C[^ (]*\.so\(\+0x[0-9a-f]+\)' "$OUT/python_crash.log" | sort -u | while read -r f; do
      so=${f%%(*}; off=${f##*(+}; off=${off%)}
      echo "$f -> $(addr2line -C -f -i -e "$so" "$off" | tr '\n' ' ')"
    done >>"$OUT/python_crash.log" 2>&1
    { echo "--- libraries"; PYTHONPATH="$site" python3 -c 'import weft, os; print(open("/proc/self/maps").read())' |
        awk '{print $6}' | grep -E '\.so' | sort -u; } >>"$OUT/python_crash.log" 2>&1
    note "python: weft.init backtrace" "-> python_crash.log"
    grep -E '\[0x|->|weft.init ok|^rc=|error|Error' "$OUT/python_crash.log" | head -n 60
  fi
  # Bounds above the time a rank may spend compiling (torch.compile) while its peers already wait on the GPU.
  for n in ${PYTHON_WORLDS:-2 4}; do
    share=()
    [ "$GPUS" -ge "$n" ] || share=(--share-gpu)  # ranks sharing a GPU under MPS; their process group is gloo
    # shellcheck disable=SC2016  # WEFT_RANK is expanded by each rank's shell
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" WEFT_STORE_TIMEOUT=${PYTHON_WAIT_S:-300} \
      WEFT_WAIT_TIMEOUT=${PYTHON_WAIT_S:-300} run_logged "python: world $n ${share[*]}" \
      "python_world$n.log" "$BUILD/weftrun" -n "$n" "${share[@]}" --timeout 1500 -- bash -c \
      'exec python3 -m pytest -q -x -p no:cacheprovider tests/python/test_gpu_ops.py tests/python/test_gpu_ep.py tests/python/test_gpu_decode.py tests/python/test_gpu_moe_tp.py --junitxml='"$OUT"'/python/world'"$n"'_rank$WEFT_RANK.xml'
    grep -E "passed|failed|error" "$OUT/python_world$n.log" | tail -n 4
  done
  # Across nodes: 4 ranks as 2 virtual nodes on the NVSHMEM heap, the ops on their two-level schedules
  # (tests/python/test_gpu_across_nodes.py; it skips itself on one node).
  share=()
  [ "$GPUS" -ge 4 ] || share=(--share-gpu)
  # shellcheck disable=SC2016  # WEFT_RANK is expanded by each rank's shell
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" WEFT_STORE_TIMEOUT=${PYTHON_WAIT_S:-300} \
    WEFT_WAIT_TIMEOUT=${PYTHON_WAIT_S:-300} WEFT_HEAP_BACKEND=nvshmem WEFT_VIRTUAL_NODES=2 \
    run_logged "python: world 4 as 2 virtual nodes" python_nodes.log "$BUILD/weftrun" -n 4 "${share[@]}" \
    --timeout 900 -- bash -c \
    'exec python3 -m pytest -q -x -p no:cacheprovider tests/python/test_gpu_across_nodes.py --junitxml='"$OUT"'/python/nodes_rank$WEFT_RANK.xml'
  grep -E "passed|failed|error|skipped" "$OUT/python_nodes.log" | tail -n 4
fi

# The Python package as the python stage installs it, without its tests, into $BUILD/python-site: built
# again on every call (incrementally, in $BUILD/python), so it is never older than the tree.
site="$PWD/$BUILD/python-site"
install_package() {
  python3 -c 'import scikit_build_core' 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links .deps/wheels scikit-build-core >"$OUT/install_skb.log" 2>&1
  run_logged "install the package" install_package.log python3 -m pip install -q --no-build-isolation --no-index \
    --no-deps --target "$site" -C cmake.define.WEFT_PREBUILT_LIBWEFT="$PWD/$BUILD/libweft.a" -C build-dir="$BUILD/python" .
}

if has e2e; then  # issue 31's end-to-end example and host overhead (docs/PYTHON.md): world 1, then 2 (sharing where 1 GPU)
  install_package
  # GEMM choices kept in the build folder: a later call on the same machine skips their tuning.
  export WEFT_TUNE_CACHE=${WEFT_TUNE_CACHE:-$PWD/$BUILD/e2e_tune_cache.txt}
  t_e2e=$SECONDS
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" run_logged "e2e: host overhead, world 1" e2e_host_overhead.log \
    timeout 300 python3 tools/bench/host_overhead.py --bench "$BUILD/weft-bench" --json
  sed -n '/^host overhead, world 1/,$p' "$OUT/e2e_host_overhead.log" | grep -v '^{'
  note "e2e: host overhead" "$(grep -E '^host_overhead:' "$OUT/e2e_host_overhead.log" | tail -n 1 | cut -c 16- || true)"
  # Where the out-of-place op's extra host time goes (ROADMAP, host overhead): an op returning a new tensor
  # against one returning its input, with the generic autograd fallback, a fallthrough and an explicit kernel.
  run_logged "e2e: dispatch probe (cuda)" e2e_dispatch_probe.log \
    timeout 300 python3 tools/torch_dispatch_probe.py --device cuda --calls 50000 --repeats 5
  grep -E '^[#|]' "$OUT/e2e_dispatch_probe.log"
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" run_logged "e2e: tp_block, world 1" e2e_tp_block_w1.log \
    timeout 420 python3 examples/python/tp_block.py --seq 1024,4096 --compile --graph 1000
  grep -E '^ +(ok|FAIL)|^ *seq |^ +[0-9]+ |skipped|NOTE|^tp_block: ' "$OUT/e2e_tp_block_w1.log" | tail -n 20
  note "e2e: tp_block world 1" "$(grep -E '^tp_block: (every|[0-9]+ check)' "$OUT/e2e_tp_block_w1.log" | cut -c 1-150)"
  share=()
  [ "$GPUS" -ge 2 ] || share=(--share-gpu)  # one GPU: ranks share it under MPS; their process group is gloo
  # Bounds above the time a rank may spend compiling (torch.compile) while its peer already waits on the GPU.
  PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" WEFT_STORE_TIMEOUT=300 WEFT_WAIT_TIMEOUT=300 \
    run_logged "e2e: tp_block, world 2 ${share[*]}" e2e_tp_block_w2.log "$BUILD/weftrun" -n 2 "${share[@]}" --timeout 420 -- \
    python3 examples/python/tp_block.py --seq 1024 --check-only --compile
  grep -E '^ +(ok|FAIL)|skipped|NOTE|^tp_block: ' "$OUT/e2e_tp_block_w2.log" | tail -n 12
  note "e2e: tp_block world 2" "$(grep -E '^tp_block: (every|[0-9]+ check)' "$OUT/e2e_tp_block_w2.log" | cut -c 1-150)"
  note "e2e: stage time" "$((SECONDS - t_e2e)) s"
fi

if has shared; then  # weft-bench with ranks sharing one GPU: checks only, no figures (the rehearsal of a multi-GPU run)
  for n in 2 4; do
    for spec in "all_gather --bytes 1K:64M" "all_reduce --bytes 1K:64M" "reduce_scatter --bytes 4K:64M" \
                "ag_gemm --m 2048 --n 4096 --k 4096" "gemm_rs --m 2048 --n 4096 --k 4096" "gemm_ar --m 2048 --n 4096 --k 4096"; do
      # shellcheck disable=SC2086  # spec is a word list
      "$BUILD/weftrun" -n "$n" --share-gpu --timeout 300 -- "$BUILD/weft-bench" $spec --samples 5 >>"$OUT/shared_bench.txt" 2>&1
      note "shared bench, world $n: ${spec%% *}" "rc=$?"
    done
  done
  grep -vE '^\[weft-bench\]' "$OUT/shared_bench.txt" | head -n 120
fi

if has pdl; then  # what programmatic dependent launch buys the small collectives
  for pdl in 1 0 1 0; do
    for op in all_gather all_reduce reduce_scatter; do
      WEFT_PDL=$pdl "$BUILD/weftrun" -n "$GPUS" -- "$BUILD/weft-bench" $op --bytes 1K,16K,64K --variant ll \
        --samples 25 --json 2>/dev/null | sed "s/^/pdl=$pdl /" >>"$OUT/pdl_ab.txt"
    done
  done
  python3 - "$OUT/pdl_ab.txt" <<'PY'
import json, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    tag, _, js = line.partition(" ")
    if not js.startswith("{"): continue
    r = json.loads(js)
    rows.setdefault((r["op"], r["bytes"]), {}).setdefault(tag, []).append(r["weft_loop_us"])
print("PDL A/B, ll variant, loop us per call (two runs each, interleaved):")
for (op, b), d in sorted(rows.items()):
    print(f"  {op:15s} {b >> 10:4d}K  " + "  ".join(f"{t}: " + "/".join(f"{x:.2f}" for x in v) for t, v in sorted(d.items())))
PY
fi

if has gemm; then  # the GEMM engine alone against cuBLAS, every rank on its own GPU
  run_logged "gemm vs cuBLAS" gemm.txt "$BUILD/weftrun" -n "$GPUS" --timeout 300 -- "$BUILD/weft-bench" gemm --samples 10
  cat "$OUT/gemm.txt"
fi

if has hooks; then  # the hooked GEMM kernels alone (nothing waited on) against the plain ones
  time_hooks() {  # shapes, then "hook [--any-order]|config" specs (an empty config: tuned)
    local shapes=$1 spec hook cfg name flags
    shift
    for spec in "$@"; do
      hook=${spec%%|*} cfg=${spec#*|}
      read -r name flags <<<"$hook"
      echo "### hook $hook, config '${cfg:-tuned}'" >>"$OUT/hooks.txt"
      "$BUILD/weftrun" -n "$GPUS" --timeout 300 -- "$BUILD/weft-bench" gemm --shapes "$shapes" --samples 10 \
        --hook "$name" $flags ${cfg:+--config "$cfg"} >>"$OUT/hooks.txt" 2>/dev/null
    done
  }
  # AllGather + GEMM: one GEMM over all M rows, in the row-major tile order.
  time_hooks '2048,14336,8192;4096,14336,8192;8192,14336,8192;2048,4096,8192;4096,4096,8192;8192,4096,8192' \
    "none|" "wait_a_rows|"
  # The ring's GEMMs: a step's block (M/W rows, K/W deep) with the source it
  # adds, in the row-major order (steps that send on) or any (the last step).
  time_hooks '1024,8192,4096;2048,8192,4096;4096,8192,4096;1024,8192,14336;4096,8192,14336' \
    "none|" "wait_source_rows|" "wait_source_rows --any-order|"
  note "hooked GEMMs alone" "-> hooks.txt"
  grep -E "^###|^ +[0-9]" "$OUT/hooks.txt"
fi

if has cublas; then  # which kernel cuBLAS runs at each GEMM shape (tile, cluster, schedule in its name)
  run_logged "cuBLAS kernel names" cublas_kernels.txt python3 tools/cublas_kernels.py
  cat "$OUT/cublas_kernels.txt"
fi

if has tune; then  # copy-engine chunk size for the bulk reductions
  for chunk in 8M 16M 32M 64M; do
    for op in all_reduce reduce_scatter; do
      WEFT_CE_CHUNK=$chunk "$BUILD/weftrun" -n "$GPUS" -- "$BUILD/weft-bench" $op --bytes 32M:1G --variant ce \
        --samples 9 --json 2>/dev/null | sed "s/^/chunk=$chunk /" >>"$OUT/tune_ce.txt"
    done
  done
  python3 - "$OUT/tune_ce.txt" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    tag, _, js = line.partition(" ")
    if not js.startswith("{"): continue
    r = json.loads(js)
    rows.setdefault((r["op"], r["bytes"]), {})[tag[6:]] = (r["weft_loop_us"], r["nccl_loop_us"])
for (op, b), d in sorted(rows.items()):
    print(f"{op:15s} {b >> 20:5d}M  " + "  ".join(f"{c}: {w:8.1f} ({w / n:.3f})" for c, (w, n) in d.items()))
PY
fi

if has overlap; then  # AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce vs NCCL + cuBLAS and Async-TP
  mkdir -p "$OUT/overlap"
  tb=(--torch-baselines tools/torch_tp_baselines.py)
  run_logged "overlap sweep" overlap.log python3 scripts/sweep_overlap.py --build "$BUILD" --out "$OUT/overlap" \
    --timeout 500 "${tb[@]}" ${OVERLAP_ARGS:+--extra="$OVERLAP_ARGS"} ${OVERLAP_OPS:+--ops="$OVERLAP_OPS"}
  grep -v '^\[weft-bench\]' "$OUT/overlap.log" | tail -n 40
  cp "$OUT/overlap/overlap.csv" "$OUT/overlap/overlap.png" "$OUT/" 2>/dev/null
fi

if has chunks; then  # the fused paths' copy/signal granularity, and what graph launches save
  for op in ${CHUNK_OPS:-ag_gemm gemm_rs gemm_ar}; do
    for chunks in ${CHUNK_COUNTS:-1 2 4 8 16}; do
      "$BUILD/weftrun" -n "$GPUS" --timeout 200 -- "$BUILD/weft-bench" $op --m 2048,4096 --n 8192 --k 8192 \
        --variant fused --chunks $chunks --samples 9 $CHUNK_ARGS --json 2>/dev/null | sed "s/^/chunks=$chunks graphs=1 /" >>"$OUT/chunks.txt"
    done
    WEFT_PLAN_GRAPHS=0 "$BUILD/weftrun" -n "$GPUS" --timeout 200 -- "$BUILD/weft-bench" $op --m 2048,4096 --n 8192 \
      --k 8192 --variant fused --samples 9 $CHUNK_ARGS --json 2>/dev/null | sed "s/^/chunks=default graphs=0 /" >>"$OUT/chunks.txt"
  done
  python3 - "$OUT/chunks.txt" <<'PY'
import json, sys
print("fused path by chunks per rank's rows: weft ms (the fused GEMMs alone ms)")
for line in open(sys.argv[1]):
    c, g, js = line.split(" ", 2)
    if not js.startswith("{"): continue
    r = json.loads(js)
    print(f"  {r['op']:8s} {r['m']}x{r['n']}x{r['k']} {c:15s} {g}: {r['weft_ms']:.3f} ({r['gemm_hooked_ms']:.3f})"
          f" {r['vs_ideal']:.3f}x ideal [{r['path']}]")
PY
fi

if has probe && [ "$GPUS" -ge 2 ]; then  # does a copy into a peer's mapping need SMs? (tools/copy_probe.cu)
  run_logged "copy probe" copy_probe.log "$BUILD/weftrun" -n 2 --timeout 120 -- "$BUILD/weft-copy-probe"
  grep -E "^rank|probe:" "$OUT/copy_probe.log"
fi

if has probe; then  # what a wait on a flag already set costs, written each way (tools/wait_probe.cu)
  run_logged "wait probe" wait_probe.log "$BUILD/weft-wait-probe"
  grep -E "probe" "$OUT/wait_probe.log"
  # what a fused call's wrappings (flag memset, side stream, graph) add to a kernel (tools/launch_probe.cu)
  run_logged "launch probe" launch_probe.log "$BUILD/weft-launch-probe"
  grep -E "probe" "$OUT/launch_probe.log"
fi

if has waits; then  # how long the hooked tiles wait for rows (WEFT_TILE_WAITS), fused path only
  # WAITS_SPECS: ';'-separated weft-bench arguments (default: the operators at K = 8192 / N = 8192).
  IFS=';' read -ra specs <<<"${WAITS_SPECS:-ag_gemm --m 2048,4096,8192 --n 8192 --k 8192;gemm_rs --m 2048,4096,8192 --n 8192 --k 8192}"
  for spec in "${specs[@]}"; do
    echo "### $spec" >>"$OUT/waits.txt"
    WEFT_TILE_WAITS=1 WEFT_LOG_LEVEL=info "$BUILD/weftrun" -n "$GPUS" --timeout 200 -- "$BUILD/weft-bench" $spec \
      --variant fused --samples 15 >>"$OUT/waits.txt" 2>&1
  done
  note "tile waits" "-> waits.txt"
  grep -E "^###|tiles waited|^ +[0-9]" "$OUT/waits.txt" | sed 's/^\[weft rank [0-9]*\/[0-9]*\] //' | cut -c1-300
fi

if has soak; then  # each contender alone for a while, and the SM clock and power it ran at (clocks.log)
  # SOAK_SPECS: ';'-separated weft-bench arguments (gemm, ag_gemm, gemm_rs, gemm_ar); SOAK_S: seconds per contender.
  IFS=';' read -ra specs <<<"${SOAK_SPECS:-ag_gemm --m 8192 --n 8192 --k 8192;gemm_rs --m 2048,8192 --n 8192 --k 8192}"
  for spec in "${specs[@]}"; do
    eval "words=($spec)"  # shell quoting inside a spec holds, e.g. --config '128x256x64 c2x1 cooperative'
    fused=(--variant fused)
    [[ ${words[0]} == gemm ]] && fused=()  # a GEMM alone: weft's and cuBLAS's
    "$BUILD/weftrun" -n "$GPUS" --timeout 300 -- "$BUILD/weft-bench" "${words[@]}" "${fused[@]}" --samples 9 \
      --soak "${SOAK_S:-3}" >>"$OUT/soak.txt" 2>&1
  done
  sleep 1  # the clock log's last samples
  note "soak" "-> soak.txt"
  python3 - "$OUT/soak.txt" "$OUT/clocks.log" <<'PY'
import re, statistics, sys, time, datetime
clocks = []  # (unix ms, gpu, sm MHz, W)
for line in open(sys.argv[2]):
    f = [x.strip() for x in line.split(",")]
    try:
        dt = datetime.datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f")
        clocks.append((time.mktime(dt.timetuple()) * 1000 + dt.microsecond / 1000, int(f[1]), float(f[2]), float(f[4])))
    except (ValueError, IndexError):
        pass
pat = re.compile(r"soak (\S+) (\S+) rank (\d+): (.+?) \| (\d+) calls, ([\d.]+) ms per call, unix ms ([\d.]+) to ([\d.]+)")
rows, seen = {}, {}
for line in open(sys.argv[1]):
    m = pat.search(line)
    if not m: continue
    op, shape, rank, who, calls, ms, t0, t1 = m.groups()
    rank, t0, t1 = int(rank), float(t0), float(t1)
    # The same contender in a later run (another spec) is another row.
    run = seen[(op, shape, who, rank)] = seen.get((op, shape, who, rank), 0) + 1
    if run > 1: who = f"{who} (run {run})"
    inside = [c for c in clocks if c[1] == rank and t0 + 500 <= c[0] <= t1]  # the first 0.5 s: ramp
    mhz = statistics.median([c[2] for c in inside]) if inside else float("nan")
    watts = statistics.median([c[3] for c in inside]) if inside else float("nan")
    rows.setdefault((op, shape, who), []).append((rank, float(ms), mhz, watts, len(inside)))
print("soak: each contender alone; ms per call (slowest rank); per rank (its GPU): median SM MHz, W, samples")
for (op, shape, who), rs in rows.items():
    per = "  ".join(f"r{r}: {mhz:5.0f} MHz {w:4.0f} W ({n})" for r, _, mhz, w, n in sorted(rs))
    print(f"soak: {op:8s} {shape:15s} {who:18s} {max(x[1] for x in rs):8.4f} ms | {per}")
PY
fi

if has ab && [ "$GPUS" -ge 2 ]; then  # an A/B of environment settings over weft-bench runs, interleaved by round
  # AB_ENVS: ';'-separated settings (each one or more VAR=value); AB_SPECS: ';'-separated weft-bench arguments.
  IFS=';' read -ra ab_envs <<<"${AB_ENVS:?the ab stage needs AB_ENVS, e.g. 'WEFT_PDL=1;WEFT_PDL=0'}"
  IFS=';' read -ra ab_specs <<<"${AB_SPECS:?the ab stage needs AB_SPECS, e.g. 'gemm_rs --m 2048 --n 8192 --k 8192'}"
  t0=$SECONDS
  for ((round = 1; round <= ${AB_ROUNDS:-2}; ++round)); do
    for setting in "${ab_envs[@]}"; do
      for spec in "${ab_specs[@]}"; do
        echo "### ab round $round, $setting: weft-bench $spec" | tee -a "$OUT/ab.log"
        # shellcheck disable=SC2086  # the setting and the spec are word lists
        env $setting "$BUILD/weftrun" -n 2 --timeout 300 -- "$BUILD/weft-bench" $spec --json 2>>"$OUT/ab.log" |
          sed "s|^|$round\t$setting\t$spec\t|" >>"$OUT/ab.txt"
      done
    done
  done
  ab_lines=$(cat "$OUT/ab.txt" 2>/dev/null | grep -c .)  # grep -c prints 0 itself where none
  note "ab" "$ab_lines JSON lines ($((SECONDS - t0)) s) -> ab.txt, ab.log"
  python3 - "$OUT/ab.txt" <<'PY' | tee "$OUT/ab_table.txt"
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    rnd, setting, spec, js = line.rstrip("\n").split("\t", 3)
    if not js.startswith("{"): continue
    r = json.loads(js)
    # A row per shape and path, a line per setting and run (the weft-bench
    # arguments), so two specs that run the same path stay apart.
    key = (r.get("op"), r.get("m"), r.get("n"), r.get("k"), r.get("path", ""))
    label = f"{setting} | {spec}"
    gemm = min(r.get("gemm_weft_ms") or 1e9, r.get("gemm_cublas_ms") or 1e9)
    rows.setdefault(key, {}).setdefault(label, []).append((r.get("weft_ms"), r.get("vs_ideal"), gemm, r.get("gemm_hooked_ms")))
print("A/B: weft ms / x ideal per round, then the medians (the path that ran in brackets; setting | weft-bench run);")
print("GEMM = the faster GEMM alone, fused = the fused path's GEMMs alone (medians over rounds)")
for key, by in sorted(rows.items(), key=lambda kv: str(kv[0])):
    for setting, v in sorted(by.items()):
        runs = "  ".join(f"{t[0]:.4f}/{t[1]:.3f}" for t in v if t[0] is not None and t[1] is not None)
        med = lambda i: statistics.median([t[i] for t in v if t[i] is not None] or [float("nan")])
        print(f"  {key[0]} {key[1]}x{key[2]}x{key[3]} [{key[4]}]  {setting}  {runs}  median {med(0):.4f} ms, {med(1):.3f}x,"
              f" GEMM {med(2):.4f}, fused {med(3):.4f}")
PY
fi

if has trace; then  # the fused paths' timelines (WEFT_TRACE_OVERLAP): where each call's time goes
  # TRACE_SPECS: ';'-separated weft-bench arguments, each optionally led by VAR=value settings.
  IFS=';' read -ra specs <<<"${TRACE_SPECS:-ag_gemm --m 2048,8192 --n 8192 --k 8192;ag_gemm --m 8192 --n 28672 --k 8192;gemm_rs --m 2048,8192 --n 8192 --k 8192;gemm_ar --m 2048,8192 --n 8192 --k 8192}"
  for spec in "${specs[@]}"; do
    echo "### $spec" >>"$OUT/trace.txt"
    env WEFT_TRACE_OVERLAP=3 WEFT_LOG_LEVEL=info $(grep -oE '^( *[A-Z_]+=[^ ]+)+' <<<"$spec") \
      "$BUILD/weftrun" -n "$GPUS" --timeout 200 -- "$BUILD/weft-bench" $(sed -E 's/^( *[A-Z_]+=[^ ]+)+//' <<<"$spec") \
      --variant fused --samples 5 --no-hold >>"$OUT/trace.txt" 2>&1  # traced calls synchronise: nothing to hold
  done
  note "trace" "-> trace.txt"
  grep -E "^###|trace, rank|^\[weft-bench\]   weft" "$OUT/trace.txt" | sed 's/^\[weft rank [0-9]*\/[0-9]*\] //' | cut -c1-400
fi

if has decode; then  # decode attention: its GPU tests, weft-bench decode against the copy bound, torch SDPA on the same shapes
  run_logged "decode tests, 1 rank" decode_tests.log "$BUILD/weftrun" -n 1 --timeout 600 -- \
    "$BUILD/tests/weft_gpu_tests" --gtest_filter='FlashDecode.*:DistFlashDecode.*'
  grep -E "^\[ +(OK|FAILED|PASSED) +\]|Failure|error" "$OUT/decode_tests.log" | head -n 30
  for n in 2 4 8; do  # the distributed decode at world 2, 4, 8 on one GPU (and FlashDecode per rank at 4)
    filter='DistFlashDecode.*'
    [ "$n" = 4 ] && filter='FlashDecode.*:DistFlashDecode.*'
    run_logged "decode tests, $n ranks sharing a GPU" "decode_tests_$n.log" "$BUILD/weftrun" -n "$n" --share-gpu \
      --timeout 900 -- "$BUILD/tests/weft_gpu_tests" --gtest_filter="$filter"
    grep -E "PASSED|FAILED|Failure" "$OUT/decode_tests_$n.log" | head -n 20
  done
  # The distributed call's exchange and combine (dist us, exchange us = dist - the shard's FlashDecode,
  # combine us = DistFlashDecode::combine alone): at 1 rank, and at 2 sharing the GPU (not figures).
  dist_cases="1,96,12,32768;1,32,8,131072;8,32,8,32768,16;32,32,8,32768,16"
  run_logged "weft-bench decode --dist, 1 rank" decode_dist_1.txt "$BUILD/weftrun" -n 1 --timeout 300 -- \
    "$BUILD/weft-bench" decode --dist --check --cases "$dist_cases"
  grep -v '^\[weft-bench\]' "$OUT/decode_dist_1.txt"
  run_logged "weft-bench decode --dist, 2 ranks sharing a GPU" decode_dist_2.txt "$BUILD/weftrun" -n 2 --share-gpu \
    --timeout 300 -- "$BUILD/weft-bench" decode --dist --cases "$dist_cases"
  grep -v '^\[weft-bench\]' "$OUT/decode_dist_2.txt"
  # The kernel variants [0064] (half the splits, 3 and 6 stages, both merges, both page lookups), each
  # case's in turn with its default and checked, so one run says which wins where; SDPA below, same shapes.
  run_logged "weft-bench decode --sweep" decode_sweep.txt "$BUILD/weftrun" -n 1 --timeout 600 -- \
    "$BUILD/weft-bench" decode --sweep --check ${DECODE_SWEEP_ARGS:-}
  grep -v '^\[weft-bench\]' "$OUT/decode_sweep.txt"
  for dtype in ${DECODE_DTYPES:-bf16 fp16}; do
    run_logged "weft-bench decode $dtype" "decode_$dtype.txt" "$BUILD/weftrun" -n 1 --timeout 600 -- \
      "$BUILD/weft-bench" decode --dtype "$dtype" --check ${DECODE_ARGS:-}
    grep -v '^\[weft-bench\]' "$OUT/decode_$dtype.txt"
    if python3 -c 'import torch' 2>/dev/null; then
      run_logged "torch SDPA decode $dtype" "decode_sdpa_$dtype.txt" python3 tools/bench/decode_sdpa.py --dtype "$dtype"
      cat "$OUT/decode_sdpa_$dtype.txt"
    else
      note "torch SDPA decode" "not run: python3 has no torch here"
    fi
  done
fi

if has ep; then  # MoE expert parallelism: weft-bench ep at world 1, then its GPU tests at EP_TEST_WORLDS (sharing)
  # DeepEP's normal-mode shape: 4096 tokens, hidden 7168, top-8 of 256 (weft-bench's defaults); low-latency: 128.
  run_logged "weft-bench ep, world 1" ep_bench_w1.txt "$BUILD/weftrun" -n 1 --timeout 300 -- "$BUILD/weft-bench" ep \
    --check --samples 30
  grep -vE '^\[weft-bench\]' "$OUT/ep_bench_w1.txt"
  # The gpu stage's suite runs these tests at every size too: EP_TEST_WORLDS="" times weft-bench ep alone.
  for n in ${EP_TEST_WORLDS-1 2 4 8}; do
    share=()
    [ "$GPUS" -ge "$n" ] || share=(--share-gpu)
    run_logged "EP tests, world $n ${share[*]}" "ep_tests_w$n.log" "$BUILD/weftrun" -n "$n" "${share[@]}" --tag-output \
      --timeout 600 -- "$BUILD/tests/weft_gpu_tests" --gtest_filter='ExpertParallel*'
    grep -E "^\[rank 0\] \[ +(OK|FAILED|PASSED) +\]|Failure" "$OUT/ep_tests_w$n.log" | head -n 20
  done
fi

if has moe; then  # MoE under tensor parallelism: weft-bench moe_tp (AgMoe and MoeRs, each on both paths, against their GEMMs alone), checked
  # MOE_WORLDS (default 1): at more ranks than GPUs the ranks share them and the
  # run checks the full-size shapes; its times are not performance figures.
  for n in ${MOE_WORLDS:-1}; do
    share=()
    [ "$GPUS" -ge "$n" ] || share=(--share-gpu)
    suffix=""
    [ "$n" = 1 ] || suffix="_w$n"
    for routing in ${MOE_ROUTINGS:-uniform zipf}; do
      run_logged "weft-bench moe_tp, $routing, world $n ${share[*]}" "moe_tp_$routing$suffix.txt" \
        "$BUILD/weftrun" -n "$n" "${share[@]}" --timeout 600 -- "$BUILD/weft-bench" moe_tp --check --routing "$routing"
      grep -vE '^\[weft-bench\]' "$OUT/moe_tp_$routing$suffix.txt"
    done
  done
fi

if has grouped; then  # the grouped GEMM: its GPU tests, weft-bench grouped_gemm and torch._grouped_mm on issue 33's shapes
  run_logged "grouped GEMM tests, 1 rank" grouped_tests.log "$BUILD/weftrun" -n 1 --timeout 600 -- \
    "$BUILD/tests/weft_gpu_tests" --gtest_filter='GroupedGemm.*'
  grep -E "^\[ +(OK|FAILED|PASSED) +\]|Failure|error" "$OUT/grouped_tests.log" | head -n 30
  # Issue 33's three shapes (weft-bench's defaults; torch's too) under each routing, bf16, W [E, N, K].
  : >"$OUT/grouped.jsonl"
  for routing in ${GROUPED_ROUTINGS:-uniform zipf}; do
    run_logged "weft-bench grouped_gemm, $routing" "grouped_$routing.txt" "$BUILD/weftrun" -n 1 --timeout 600 -- \
      "$BUILD/weft-bench" grouped_gemm --routing "$routing" --json ${GROUPED_ARGS:-}
    grep '^{' "$OUT/grouped_$routing.txt" >>"$OUT/grouped.jsonl"
    if python3 -c 'import torch' 2>/dev/null; then
      run_logged "torch._grouped_mm, $routing" "grouped_torch_$routing.txt" python3 tools/bench/grouped_mm_torch.py \
        --routing "$routing" --json
      grep '^{' "$OUT/grouped_torch_$routing.txt" >>"$OUT/grouped.jsonl"
    else
      note "torch._grouped_mm" "not run: python3 has no torch here"
    fi
  done
  # One row per shape and routing: weft, torch and the dense cuBLAS GEMM of the same FLOPs, and the ratios.
  python3 - "$OUT/grouped.jsonl" <<'PY' | tee "$OUT/grouped_table.txt"
import json, sys
weft, torch = {}, {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["rows"], r["n"], r["k"], r["experts"], r["routing"])
    (weft if r["op"] == "grouped_gemm" else torch)[key] = r
print("grouped GEMM, bf16, W [E, N, K]; TFLOP/s = 2 x rows x N x K / time (medians of one run each)")
print(f"{'rows':>6} {'N':>5} {'K':>5} {'E':>4} {'routing':>8} | {'weft':>6} {'torch':>6} {'cuBLAS dense':>12} | "
      f"{'weft/torch':>10} {'weft/dense':>10} | weft config (chosen by), rel err")
for key in sorted(set(weft) | set(torch)):
    w, t = weft.get(key), torch.get(key)
    wt = w["weft_tflops"] if w else float("nan")
    tt = t["torch_tflops"] if t else float("nan")
    dense = w["dense_tflops"] if w else float("nan")
    print(f"{key[0]:>6} {key[1]:>5} {key[2]:>5} {key[3]:>4} {key[4]:>8} | {wt:>6.1f} {tt:>6.1f} {dense:>12.1f} | "
          f"{wt / tt:>10.3f} {wt / dense:>10.3f} | {w['config'] if w else '-'} ({w.get('chosen_by', '?') if w else '-'}), "
          f"{w['rel_err'] if w else float('nan'):.1e}")
PY
  note "grouped ratio table" "-> grouped_table.txt"
  # Each compiled tile forced on the same shapes: the timings the size heuristic's prior (0056) is to be checked against.
  : >"$OUT/grouped_configs.jsonl"
  IFS=';' read -ra grouped_configs <<<"${GROUPED_CONFIGS:-128x256x64 c2x1 cooperative;128x128x64 c1x1 cooperative}"
  for routing in ${GROUPED_ROUTINGS:-uniform zipf}; do
    for i in "${!grouped_configs[@]}"; do
      "$BUILD/weftrun" -n 1 --timeout 600 -- "$BUILD/weft-bench" grouped_gemm --routing "$routing" --json \
        --config "${grouped_configs[$i]}" >"$OUT/grouped_config_${i}_$routing.txt" 2>&1
      note "grouped_gemm --config '${grouped_configs[$i]}', $routing" "rc=$? -> grouped_config_${i}_$routing.txt"
      grep '^{' "$OUT/grouped_config_${i}_$routing.txt" >>"$OUT/grouped_configs.jsonl"
    done
  done
  python3 - "$OUT/grouped_configs.jsonl" <<'PY' | tee -a "$OUT/grouped_table.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("each tile forced (weft TFLOP/s):")
for r in sorted(rows, key=lambda r: (r["rows"], r["n"], r["k"], r["experts"], r["routing"], r["config"])):
    print(f"{r['rows']:>6} {r['n']:>5} {r['k']:>5} {r['experts']:>4} {r['routing']:>8} | {r['config']:<28} | "
          f"{r['weft_tflops']:>6.1f} | vs dense {r['vs_dense']:.3f}")
PY
fi

if has two_gpu; then  # issue 35: the new operators' figures at 2 ranks against their baselines, measured in this call
  # On 2 GPUs every time is a figure. On one GPU the same runs, ranks sharing it under MPS, are a rehearsal:
  # every result is checked, no time is a performance figure, and the NCCL and Async-TP baselines are absent.
  parts=" ${TWO_GPU_PARTS:-overlap block ep moe decode collectives} "
  part() { [[ "$parts" == *" $1 "* ]]; }
  mkdir -p "$OUT/two_gpu"
  share=()
  [ "$GPUS" -ge 2 ] || share=(--share-gpu)
  W2=("$BUILD/weftrun" -n 2 "${share[@]}" --timeout 600 --)
  note "two_gpu" "$([ "$GPUS" -ge 2 ] && echo "2 GPUs: figures" || echo "1 GPU: a rehearsal, checks only, no figures")"
  if part overlap; then  # dense AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce, bf16 and fp16, PERF.md's shapes
    for dt in bf16 fp16; do
      if [ "$GPUS" -ge 2 ]; then
        run_logged "two_gpu: overlap $dt" "two_gpu/overlap_$dt.log" python3 scripts/sweep_overlap.py --build "$BUILD" \
          --out "$OUT/two_gpu/overlap_$dt" --timeout 500 --torch-baselines tools/torch_tp_baselines.py \
          --extra="--dtype $dt --samples 15"
        grep -v '^\[weft-bench\]' "$OUT/two_gpu/overlap_$dt.log" | tail -n 30
      else
        for op in ag_gemm gemm_rs gemm_ar; do
          run_logged "two_gpu: $op $dt" "two_gpu/${op}_$dt.log" "${W2[@]}" "$BUILD/weft-bench" "$op" --m 2048 --n 4096 \
            --k 4096 --dtype "$dt" --check --samples 3
        done
      fi
    done
  fi
  if part block; then  # examples/python/tp_block.py at TP 2 against torch + NCCL and Async-TP
    install_package
    seqs=1K,2K,4K,8K,16K
    block_args=(--seq "$seqs")
    [ "$GPUS" -ge 2 ] || block_args=(--seq 1K --check-only)
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" WEFT_STORE_TIMEOUT=300 WEFT_WAIT_TIMEOUT=300 \
      run_logged "two_gpu: tp_block TP 2" two_gpu/tp_block.log "$BUILD/weftrun" -n 2 "${share[@]}" --timeout 900 -- \
      python3 examples/python/tp_block.py "${block_args[@]}"
    grep -E '^ +(ok|FAIL)|^ *seq |^ +[0-9]+ |skipped|NOTE|^tp_block: ' "$OUT/two_gpu/tp_block.log" | tail -n 20
  fi
  if part ep; then  # expert parallelism at EP 2: 4096 tokens per rank, hidden 7168, top-8 of 256; bf16 and fp8; LL at 128
    run_logged "two_gpu: ep" two_gpu/ep.txt "${W2[@]}" "$BUILD/weft-bench" ep --check --samples 30
    grep -vE '^\[weft-bench\]' "$OUT/two_gpu/ep.txt"
  fi
  if part moe; then  # MoE under TP 2 on the three MoE shapes: AgMoe and MoeRs, each sequential and overlapped side by side
    for routing in uniform zipf; do
      run_logged "two_gpu: moe_tp $routing" "two_gpu/moe_tp_$routing.txt" "${W2[@]}" "$BUILD/weft-bench" moe_tp --check \
        --routing "$routing"
      grep -vE '^\[weft-bench\]' "$OUT/two_gpu/moe_tp_$routing.txt"
    done
  fi
  if part decode; then  # distributed decode: 256K keys on 2 GPUs against 128K on one (scaling), and the combine step
    one=(1,32,8,131072 1,96,12,131072)
    two=(1,32,8,262144 1,96,12,262144)
    run_logged "two_gpu: decode, 128K on one GPU" two_gpu/decode_one.jsonl "$BUILD/weftrun" -n 1 --timeout 300 -- \
      "$BUILD/weft-bench" decode --check --json --cases "$(IFS=';'; echo "${one[*]}")"
    run_logged "two_gpu: decode --dist, 256K on two" two_gpu/decode_two.jsonl "${W2[@]}" "$BUILD/weft-bench" decode \
      --dist --check --json --cases "$(IFS=';'; echo "${two[*]}")"
    python3 - "$OUT/two_gpu/decode_one.jsonl" "$OUT/two_gpu/decode_two.jsonl" "$GPUS" <<'PY' | tee "$OUT/two_gpu/decode_scaling.txt"
import json, sys
rows = lambda f: [json.loads(l) for l in open(f) if l.startswith("{")]
one = {(r["q_heads"], r["kv_heads"]): r for r in rows(sys.argv[1])}
print("distributed decode, batch 1: 128K keys on one GPU against 256K on two (efficiency = one's us / two's dist us;"
      " goal at least 0.9), and the combine step alone (goal at most 8 us)"
      + ("" if int(sys.argv[3]) >= 2 else "; ranks share one GPU: NOT performance figures"))
for r in rows(sys.argv[2]):
    o = one.get((r["q_heads"], r["kv_heads"]))
    eff = o["us"] / r["dist_us"] if o else float("nan")
    print(f"  {r['q_heads']}/{r['kv_heads']} heads: one GPU {o['us'] if o else float('nan'):.1f} us, two GPUs "
          f"{r['dist_us']:.1f} us, efficiency {eff:.3f}; combine {r['combine_us']:.1f} us")
PY
  fi
  if part collectives; then  # AllReduce at 64 KB and below (time) and 64 MB and above (bus bandwidth) against NCCL
    if [ "$GPUS" -ge 2 ]; then
      run_logged "two_gpu: all_reduce sweep" two_gpu/collectives.log python3 scripts/sweep_collectives.py \
        --build "$BUILD" --out "$OUT/two_gpu/collectives" --ops all_reduce --bytes 1K:1G --timeout 560 --nproc 2
    else
      run_logged "two_gpu: all_reduce" two_gpu/collectives.log "${W2[@]}" "$BUILD/weft-bench" all_reduce \
        --bytes 1K:64K,64M:256M --check --samples 5
    fi
    grep -v '^\[weft-bench\]' "$OUT/two_gpu/collectives.log" | tail -n 40
  fi
  # The sweeps' CSVs and plots in one archive (the device tool returns at most 8 files).
  ( cd "$OUT" && find two_gpu -type f \( -name '*.csv' -o -name '*.png' \) -print0 |
      tar czf two_gpu_tables.tgz --null -T - --remove-files ) 2>/dev/null
fi

if has bench; then
  # PyTorch's symmetric-memory one-shot all-reduce, for the comparison below 1 MB.
  if [ "$GPUS" -ge 2 ]; then
    run_logged "torch symm-mem one-shot" torch_symm_mem.log python3 -m torch.distributed.run --nproc_per_node="$GPUS" \
      tools/torch_symm_mem_bench.py --bytes 1K:1M --samples 25 --out "$OUT/torch_ar.jsonl"
    tail -n 14 "$OUT/torch_symm_mem.log"
  fi
  mkdir -p "$OUT/sweep"
  torch_json=()
  [ -s "$OUT/torch_ar.jsonl" ] && torch_json=(--torch-json "$OUT/torch_ar.jsonl")
  run_logged "sweep all_reduce, reduce_scatter, all_gather" sweep.log python3 scripts/sweep_collectives.py \
    --build "$BUILD" --out "$OUT/sweep" --bytes "${SWEEP_BYTES:-1K:1G}" --timeout 560 "${torch_json[@]}" \
    ${BENCH_ARGS:+--extra="$BENCH_ARGS"}
  grep -v '^\[weft-bench\]' "$OUT/sweep.log" | tail -n 90
fi

kill "$CLOCKS_PID" 2>/dev/null
clocks=$(python3 - "$OUT/clocks.log" <<'PY'
import collections, statistics, sys
busy = collections.defaultdict(list)  # per GPU: samples drawing over 200 W
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        gpu, sm, power, reasons = int(f[1]), int(f[2]), float(f[4]), f[6]
    except (IndexError, ValueError):
        continue
    if power > 200: busy[gpu].append((sm, reasons))
out = []
for gpu in sorted(busy):
    sms = [s for s, _ in busy[gpu]]
    top = collections.Counter(r for _, r in busy[gpu]).most_common(2)
    out.append(f"GPU {gpu}: {len(sms)} busy samples, SM MHz median {statistics.median(sms):.0f} min {min(sms)}, reasons {top}")
print("; ".join(out) or "no busy samples")
PY
)
note "clocks while busy" "$clocks"

echo
{
  echo "==== summary ($(date -u +%F) on $GPUS GPU(s)) ===="
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUT/summary.txt"
# Everything but the summary, the CSVs and the plots goes into one archive.
( cd "$OUT" && find . -type f ! -name summary.txt ! -name '*.csv' ! -name '*.png' ! -name logs.tgz -print0 |
    tar czf logs.tgz --null -T - --remove-files ) 2>/dev/null
