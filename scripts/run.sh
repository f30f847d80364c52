#!/usr/bin/env bash
# The main job: the AllGather benchmark on every local GPU against NCCL,
# with bitwise checks. Extra arguments go to weft-bench (e.g. --bytes 1K:64M --json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh >/dev/null
BUILD=${WEFT_BUILD_DIR:-build}
gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
fi
if [ "$gpus" -eq 0 ]; then
  echo "weft: no NVIDIA GPU on this machine, so the benchmark cannot run (the build and 'scripts/test.sh' still work)." >&2
  exit 1
fi
exec "$BUILD/weftrun" -n "$gpus" -- "$BUILD/weft-bench" all_gather --bytes 1K:256M --check "$@"
