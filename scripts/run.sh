#!/usr/bin/env bash
# The main job: the AllGather benchmark on every local GPU against NCCL, with
# bitwise checks. Extra arguments go to weft-bench (e.g. --bytes 1K:64M --json).
#
# First, within seconds and before anything is installed or built, it checks
# what the benchmark needs and says at once what is missing:
#   - an NVIDIA GPU that nvidia-smi lists;
#   - a driver that supports CUDA 13.0 or newer (nvidia-smi: "CUDA Version: 13.x"; driver 580 or newer);
#   - Hopper GPUs: compute capability 9.0 (H100, H200, GH200), as weft's kernels are built for sm_90a.
# Then it sets up (scripts/setup.sh), builds (scripts/build.sh, with progress
# and a time estimate) and runs the benchmark. CUDA_VISIBLE_DEVICES, when set,
# picks the GPUs that are checked and used.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${WEFT_BUILD_DIR:-build}

say() { echo "[run] $*"; }
fail() {
  echo "[run] $*" >&2
  echo "[run] (without a suitable GPU, 'bash scripts/test.sh' still builds weft and runs its CPU tests)" >&2
  exit 1
}
smi() { timeout 20 nvidia-smi "$@"; }  # bounded: a wedged driver can leave nvidia-smi hanging

# ---- 1. the GPU, the driver, the compute capability --------------------------
command -v nvidia-smi >/dev/null ||
  fail "no NVIDIA GPU here: nvidia-smi is not installed (no NVIDIA driver, or it is not on PATH). The benchmark needs Hopper GPUs (compute capability 9.0) and a driver for CUDA 13 (580 or newer)."
rc=0
listing=$(smi -L 2>&1) || rc=$?
[ "$rc" -ne 124 ] || fail "nvidia-smi did not answer within 20 s: the NVIDIA driver looks hung (see 'dmesg'; a reboot may be needed)."
[ "$rc" -eq 0 ] || fail "nvidia-smi finds no usable GPU: $(head -n 2 <<<"$listing" | tr '\n' ' ')"
grep -q '^GPU ' <<<"$listing" || fail "nvidia-smi lists no GPU on this machine."

[ "${CUDA_VISIBLE_DEVICES+set}" != set ] || [ -n "$CUDA_VISIBLE_DEVICES" ] ||
  fail "CUDA_VISIBLE_DEVICES is set but empty, so CUDA sees no GPU: unset it, or name the GPUs to use (e.g. 0,1)."
select=()
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && smi -i "$CUDA_VISIBLE_DEVICES" --query-gpu=index --format=csv,noheader >/dev/null 2>&1; then
  select=(-i "$CUDA_VISIBLE_DEVICES")
fi
gpu_table=$(smi "${select[@]}" --query-gpu=index,name,driver_version,compute_cap --format=csv,noheader 2>&1) ||
  fail "nvidia-smi cannot report the GPUs' driver version and compute capability (drivers older than 510 lack the compute_cap field; weft needs 580 or newer): $gpu_table"
gpus=$(grep -c . <<<"$gpu_table" || true)
[ "$gpus" -gt 0 ] || fail "nvidia-smi lists no GPU${select:+ among CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES}."

driver=$(head -n 1 <<<"$gpu_table" | awk -F', *' '{print $3}')
cuda=$(smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1 || true)
if [ -n "$cuda" ]; then
  [ "${cuda%%.*}" -ge 13 ] ||
    fail "the NVIDIA driver is too old: driver $driver supports CUDA up to $cuda, and weft is built with CUDA 13, so it needs a driver that supports CUDA 13.0 or newer (driver 580 or newer). Update the driver."
else
  [ "${driver%%.*}" -ge 580 ] 2>/dev/null ||
    fail "the NVIDIA driver is too old: driver $driver; weft is built with CUDA 13 and needs driver 580 or newer (one that supports CUDA 13.0)."
fi

not_hopper=$(awk -F', *' '$4 != "9.0" {printf "  GPU %s: %s, compute capability %s\n", $1, $2, $4}' <<<"$gpu_table")
if [ -n "$not_hopper" ]; then
  fail "weft runs on Hopper GPUs only (compute capability 9.0: H100, H200, GH200; its kernels are built for sm_90a), and these are not:
$not_hopper"
fi
say "$gpus GPU(s), $(head -n 1 <<<"$gpu_table" | awk -F', *' '{print $2}'), compute capability 9.0; driver $driver (CUDA ${cuda:-13+}): ok"

# ---- 2. set up and build ----------------------------------------------------
say "setting up (scripts/setup.sh)"
bash scripts/setup.sh
say "building (scripts/build.sh)"
bash scripts/build.sh

# ---- 3. the benchmark -------------------------------------------------------
say "weftrun -n $gpus -- weft-bench all_gather --bytes 1K:256M --check $*"
exec "$BUILD/weftrun" -n "$gpus" -- "$BUILD/weft-bench" all_gather --bytes 1K:256M --check "$@"
