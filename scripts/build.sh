#!/usr/bin/env bash
# Configures and builds weft (all targets, CUDA included) into ${WEFT_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/cuda/bin"
BUILD=${WEFT_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >/dev/null
fi
cmake --build "$BUILD" -j "${WEFT_JOBS:-$(nproc)}"
