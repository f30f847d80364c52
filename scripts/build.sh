#!/usr/bin/env bash
# Configures and builds weft (all targets, CUDA included) into ${WEFT_BUILD_DIR:-build}.
#
# Parallel jobs: one CUTLASS unit peaks at about 3.3 GB of memory while it
# compiles, so the job count is the smaller of the cores and the available
# memory / 3.5 GB (at least 1): more jobs than memory allows would swap or be
# killed. WEFT_JOBS=N sets the count instead. Before a first build it prints
# how long that build takes (44 dense CUTLASS kernels and 8 grouped ones;
# measured before the grouped ones: the 20-kernel subset in 21 minutes with 2
# jobs, all 36 in 4 with 16, so about 1 + 2 x kernels / jobs minutes).
# WEFT_GEMM_KERNELS=subset compiles 20 dense and 2 grouped kernels (CI).
# WEFT_NVSHMEM=AUTO|ON|OFF builds the NVSHMEM heap backend (CI: ON).
set -euo pipefail
cd "$(dirname "$0")/.."
# nvcc: CUDA_HOME's, else CUDA_PATH's, else PATH's, else /usr/local/cuda's (as scripts/setup.sh checks).
export PATH="${CUDA_HOME:+$CUDA_HOME/bin:}${CUDA_PATH:+$CUDA_PATH/bin:}$PATH:/usr/local/cuda/bin"
BUILD=${WEFT_BUILD_DIR:-build}
say() { echo "[build] $*"; }

cores=$(nproc)
if [ -n "${WEFT_JOBS:-}" ]; then
  if ! [[ "$WEFT_JOBS" =~ ^[1-9][0-9]*$ ]]; then
    say "WEFT_JOBS must be a whole number of parallel jobs, 1 or more (got '$WEFT_JOBS')" >&2
    exit 2
  fi
  jobs=$WEFT_JOBS
  say "$jobs parallel job$([ "$jobs" = 1 ] || echo s) (WEFT_JOBS; this machine has $cores cores)"
else
  # Memory available to this build in kB: the kernel's estimate (MemAvailable),
  # lowered to what a cgroup (container) limit leaves, where there is one.
  avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo 2>/dev/null || true)
  if [ -r /sys/fs/cgroup/memory.max ] && [ -r /sys/fs/cgroup/memory.current ]; then
    limit=$(cat /sys/fs/cgroup/memory.max)
    if [[ "$limit" =~ ^[0-9]+$ ]]; then
      left_kb=$(( (limit - $(cat /sys/fs/cgroup/memory.current)) / 1024 ))
      if [ -z "$avail_kb" ] || [ "$left_kb" -lt "$avail_kb" ]; then avail_kb=$left_kb; fi
    fi
  fi
  if [ -n "$avail_kb" ]; then
    per_job_kb=$((35 * 1024 * 1024 / 10))  # 3.5 GB
    by_memory=$((avail_kb / per_job_kb))
    jobs=$(( by_memory < cores ? by_memory : cores ))
    [ "$jobs" -ge 1 ] || jobs=1
    gb=$(awk -v k="$avail_kb" 'BEGIN {printf "%.1f", k / 1048576}')
    if [ "$by_memory" -lt 1 ]; then
      why="only $gb GB of memory available, less than the ~3.3 GB one CUTLASS unit needs: the build may run out of memory"
    elif [ "$jobs" -lt "$cores" ]; then
      why="limited by memory: $gb GB available, 3.5 GB per job, as one CUTLASS unit peaks at ~3.3 GB; $cores cores"
    else
      why="one per core; $gb GB of memory available covers them at 3.5 GB per job"
    fi
  else
    jobs=$cores
    why="one per core; available memory unknown"
  fi
  say "$jobs parallel job$([ "$jobs" = 1 ] || echo s) ($why). WEFT_JOBS=N sets the count."
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# WEFT_GEMM_KERNELS=subset compiles only the GEMM kernels marked SUBSET in
# src/gemm/kernel_table.cmake (CI without a GPU); unset or =all, every kernel.
KERNELS=()
if [ -n "${WEFT_GEMM_KERNELS:-}" ]; then
  if ! [[ "$WEFT_GEMM_KERNELS" =~ ^(all|subset)$ ]]; then
    say "WEFT_GEMM_KERNELS must be 'all' or 'subset' (got '$WEFT_GEMM_KERNELS')" >&2
    exit 2
  fi
  KERNELS=(-DWEFT_GEMM_KERNELS="$WEFT_GEMM_KERNELS")
fi
# WEFT_NVSHMEM=AUTO|ON|OFF: the NVSHMEM heap backend where NVSHMEM is found (the
# default), demanded (CI), or left out (docs/decisions/0057).
if [ -n "${WEFT_NVSHMEM:-}" ]; then
  if ! [[ "${WEFT_NVSHMEM^^}" =~ ^(AUTO|ON|OFF)$ ]]; then
    say "WEFT_NVSHMEM must be AUTO, ON or OFF (got '$WEFT_NVSHMEM')" >&2
    exit 2
  fi
  KERNELS+=(-DWEFT_NVSHMEM="${WEFT_NVSHMEM^^}")
fi
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  say "configuring $BUILD"
  cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" "${KERNELS[@]}"
elif [ ${#KERNELS[@]} -gt 0 ]; then
  cmake -S . -B "$BUILD" "${KERNELS[@]}" >/dev/null
fi

if [ ! -f "$BUILD/libweft.a" ]; then
  units=$(ls "$BUILD"/gemm_configs/*.cu 2>/dev/null | wc -l || true)
  # Measured: 21 minutes with 2 jobs for the 20-kernel subset, 4 with 16 for all 36: about 1 + 2 x kernels / jobs minutes.
  parallel=$(( jobs < cores ? jobs : cores ))
  minutes=$(( 1 + (units * 2 + parallel - 1) / parallel ))
  say "a first build compiles $units CUTLASS kernels: about $minutes minutes on this machine's $cores cores ($jobs parallel job$([ "$jobs" = 1 ] || echo s); up to twice that on slower CPUs). Later builds recompile only what changed."
fi
t0=$SECONDS
cmake --build "$BUILD" -j "$jobs"
say "built $BUILD in $(( (SECONDS - t0) / 60 )) min $(( (SECONDS - t0) % 60 )) s"
