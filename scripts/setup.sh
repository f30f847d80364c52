#!/usr/bin/env bash
# Installs what weft's build needs and is missing. Idempotent; safe to re-run.
#   - build tools (cmake, ninja, g++) and GoogleTest: from Debian/Ubuntu packages (apt, when root);
#   - nvml.h: from the pip wheel nvidia-nvml-dev, unpacked into .deps/ (ignored by git);
#   - CUTLASS/CuTe headers: from the pip wheel nvidia-cutlass, unpacked into .deps/cutlass;
#   - the CUDA toolkit and NCCL must already be installed (nvcc on PATH or in /usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=.deps
mkdir -p "$DEPS"

say() { echo "[setup] $*"; }

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ! -f /usr/include/gtest/gtest.h ] && [ ! -d /usr/src/googletest ] && [ ! -d "$DEPS/googletest" ]; then
  need_apt+=(googletest libgtest-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${need_apt[*]} with apt"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
  else
    say "missing ${need_apt[*]}: install them (apt-get install ${need_apt[*]}) and re-run"; exit 1
  fi
fi

if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    say "nvcc is in /usr/local/cuda/bin but not on PATH; the build scripts add it"
  else
    say "no CUDA toolkit found (nvcc). Install CUDA 13 (https://developer.nvidia.com/cuda-downloads) and re-run."; exit 1
  fi
fi

NVML_H=$(ls /usr/local/cuda/include/nvml.h "$DEPS"/nvidia/cu13/include/nvml.h 2>/dev/null | head -n1 || true)
if [ -z "$NVML_H" ]; then
  say "fetching nvml.h (pip wheel nvidia-nvml-dev) into $DEPS"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$DEPS/wheels" 'nvidia-nvml-dev==13.0.87'
  python3 - "$DEPS" <<'PY'
import glob, sys, zipfile
deps = sys.argv[1]
whl = sorted(glob.glob(f"{deps}/wheels/nvidia_nvml_dev-*.whl"))[-1]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith("nvidia/"):
            z.extract(n, deps)
PY
fi
if [ ! -f "$DEPS/cutlass/include/cutlass/gemm/collective/collective_builder.hpp" ] ||
   [ ! -f "$DEPS/cutlass/util/include/cutlass/util/packed_stride.hpp" ]; then
  say "fetching CUTLASS/CuTe headers (pip wheel nvidia-cutlass) into $DEPS/cutlass"
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$DEPS/wheels" 'nvidia-cutlass==4.2.0.0'
  python3 - "$DEPS" <<'PY'
import glob, os, shutil, sys, zipfile
deps = sys.argv[1]
whl = sorted(glob.glob(f"{deps}/wheels/nvidia_cutlass-*.whl"))[-1]
parts = {"cutlass_library/source/include/": f"{deps}/cutlass/include/",
         "cutlass_library/source/tools/util/include/": f"{deps}/cutlass/util/include/"}
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        for prefix, dest in parts.items():
            if n.startswith(prefix) and not n.endswith("/"):
                target = dest + n[len(prefix):]
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(n) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
PY
fi
say "ok"
