#!/usr/bin/env bash
# Installs what weft's build needs and is missing, and checks what it cannot
# install. Idempotent and quick to re-run; downloads nothing that is present.
#   - build tools (cmake 3.24+, ninja, g++) and GoogleTest: Debian/Ubuntu packages (apt, when root);
#   - the CUDA toolkit (13.0 or newer) and NCCL: must be installed already
#     (NCCL: the CUDA toolkit's packages, Debian/Ubuntu libnccl-dev, or pip nvidia-nccl-cu13);
#   - nvml.h: used where it is (NVML_INCLUDE_DIR, CUDA_HOME/include, the CUDA toolkit,
#     /usr/include), else unpacked from the pip wheel nvidia-nvml-dev into .deps/;
#   - CUTLASS/CuTe headers: used where they are (CUTLASS_ROOT, or installed where CMake
#     finds them), else unpacked from the pip wheel nvidia-cutlass into .deps/cutlass;
#   - NVSHMEM (optional: the NVSHMEM heap backend, docs/decisions/0057): used where it is
#     (NVSHMEM_HOME, python3's nvidia-nvshmem-cu13 wheel), else its headers and host
#     libraries unpacked from that wheel into .deps-nvshmem/ (its wheel kept in
#     .deps-nvshmem/wheels/); skipped with WEFT_NVSHMEM=OFF. It stays out of .deps/,
#     which travels to GPU machines, where torch's wheel provides NVSHMEM.
# The wheels come from .deps/wheels/ when they are there (offline installs:
# docs/INSTALL.md, 'Installing offline', names the files), else pip downloads them into it.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=.deps
WHEELS=$DEPS/wheels
NVML_WHEEL_VERSION=13.0.87
CUTLASS_WHEEL_VERSION=4.2.0.0
# The NVSHMEM torch 2.11 installs (its wheel requires nvidia-nvshmem-cu13==3.4.5): one NVSHMEM per process.
NVSHMEM_WHEEL_VERSION=3.4.5
mkdir -p "$DEPS"

say() { echo "[setup] $*"; }
die() { echo "[setup] $*" >&2; exit 1; }
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]; }  # $1 >= $2

# ---- build tools and GoogleTest (apt) ----------------------------------------
need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ! -f /usr/include/gtest/gtest.h ] && [ ! -f /usr/local/include/gtest/gtest.h ] && [ ! -d /usr/src/googletest ] &&
   [ ! -d "$DEPS/googletest" ]; then
  need_apt+=(googletest libgtest-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${need_apt[*]} with apt"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null ||
      die "apt-get install ${need_apt[*]} failed (offline? GoogleTest may instead be a source copy in $DEPS/googletest)"
  else
    die "missing ${need_apt[*]}: install them (apt-get install ${need_apt[*]}) and re-run"
  fi
fi

# ---- CMake 3.24 or newer -------------------------------------------------------
cmake_version=$(cmake --version | sed -n '1s/[^0-9]*\([0-9][0-9.]*\).*/\1/p')
version_ge "$cmake_version" 3.24 ||
  die "CMake $cmake_version found ($(command -v cmake)); weft needs CMake 3.24 or newer. Install one: python3 -m pip install 'cmake>=3.24' (then put its bin directory first on PATH), or https://cmake.org/download/"

# ---- CUDA toolkit 13.0 or newer ------------------------------------------------
# The nvcc the build uses (scripts/build.sh): CUDA_HOME's, else CUDA_PATH's, else PATH's, else /usr/local/cuda's.
nvcc=""
for candidate in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} ${CUDA_PATH:+"$CUDA_PATH/bin/nvcc"} "$(command -v nvcc || true)" \
                 /usr/local/cuda/bin/nvcc; do
  if [ -z "$nvcc" ] && [ -n "$candidate" ] && [ -x "$candidate" ]; then nvcc=$candidate; fi
done
[ -n "$nvcc" ] ||
  die "no CUDA toolkit found (nvcc is not on PATH, in CUDA_HOME/bin or in /usr/local/cuda/bin). Install CUDA 13 (https://developer.nvidia.com/cuda-downloads) and re-run."
cuda_version=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)
[ -n "$cuda_version" ] || die "$nvcc --version does not name a CUDA release; weft needs the CUDA toolkit 13.0 or newer."
version_ge "$cuda_version" 13.0 ||
  die "CUDA $cuda_version found ($nvcc); weft needs the CUDA toolkit 13.0 or newer (https://developer.nvidia.com/cuda-downloads). Where one is installed, set CUDA_HOME to it (e.g. CUDA_HOME=/usr/local/cuda-13.0)."
cuda_include=$(cd "$(dirname "$nvcc")/../include" 2>/dev/null && pwd || true)

# ---- the two wheels: from .deps/wheels, else downloaded into it --------------
arch=$(uname -m)
# Prints the path of the wheel (pip name $1, file name glob $2, file name shown to the user $3).
wheel() {
  local found
  found=$(ls "$WHEELS"/$2 2>/dev/null | head -n 1 || true)
  if [ -n "$found" ]; then
    say "using $found (no download)" >&2
  else
    mkdir -p "$WHEELS"
    command -v python3 >/dev/null ||
      die "python3 is needed to fetch and unpack $1. Install python3 and pip, or put $3 into $WHEELS/ and install python3."
    say "downloading $1 with pip into $WHEELS" >&2
    local log
    if ! log=$(python3 -m pip download -q --no-deps --only-binary=:all: --retries 1 --timeout 20 -d "$WHEELS" "$1" 2>&1); then
      die "could not download $1 with pip (offline, or no access to the package index?). pip said: $(tail -n 1 <<<"$log")
[setup] To install offline, copy $3 into $(pwd)/$WHEELS/ and re-run; docs/INSTALL.md, 'Installing offline', says where to get it."
    fi
    found=$(ls "$WHEELS"/$2 2>/dev/null | head -n 1 || true)
    [ -n "$found" ] || die "pip downloaded $1, but no file $2 is in $WHEELS"
  fi
  echo "$found"
}

# ---- nvml.h -------------------------------------------------------------------
# The same places cmake/WeftDeps.cmake looks, in the same order.
nvml_h=""
for dir in ${NVML_INCLUDE_DIR:+"$NVML_INCLUDE_DIR"} ${CUDA_HOME:+"$CUDA_HOME/include"} ${CUDA_PATH:+"$CUDA_PATH/include"} \
           ${cuda_include:+"$cuda_include"} /usr/local/cuda/include /usr/include /usr/local/include \
           "$DEPS/nvml/include" "$DEPS/nvidia/cu13/include"; do
  if [ -f "$dir/nvml.h" ]; then nvml_h=$dir/nvml.h; break; fi
done
if [ -n "${NVML_INCLUDE_DIR:-}" ] && [ "$nvml_h" != "$NVML_INCLUDE_DIR/nvml.h" ]; then
  say "note: NVML_INCLUDE_DIR=$NVML_INCLUDE_DIR holds no nvml.h; looking elsewhere"
fi
if [ -z "$nvml_h" ]; then
  whl=$(wheel "nvidia-nvml-dev==$NVML_WHEEL_VERSION" "nvidia_nvml_dev-$NVML_WHEEL_VERSION-*_$arch.whl" \
        "nvidia_nvml_dev-$NVML_WHEEL_VERSION-py3-none-manylinux2014_$arch.manylinux_2_17_$arch.whl")
  command -v python3 >/dev/null || die "python3 is needed to unpack $whl"
  python3 - "$DEPS" "$whl" <<'PY'
import sys, zipfile
deps, whl = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith("nvidia/"):
            z.extract(n, deps)
PY
  nvml_h=$DEPS/nvidia/cu13/include/nvml.h
  [ -f "$nvml_h" ] || die "$whl holds no nvidia/cu13/include/nvml.h"
  say "nvml.h unpacked into $DEPS/nvidia/cu13/include"
fi

# ---- CUTLASS / CuTe headers ------------------------------------------------------
# Where CMake finds them (cmake/WeftDeps.cmake): CUTLASS_ROOT (a checkout:
# include/ + tools/util/include/; or an install: include/ holds both), .deps/cutlass,
# then the prefixes CMake searches: CMAKE_PREFIX_PATH, those of PATH's bin
# directories, /usr/local, /usr.
COLLECTIVE=cutlass/gemm/collective/collective_builder.hpp
UTIL=cutlass/util/packed_stride.hpp
cutlass_version() {  # "4.2" from <dir>/cutlass/version.h
  sed -n 's/^#define CUTLASS_\(MAJOR\|MINOR\) \([0-9]*\).*/\2/p' "$1/cutlass/version.h" 2>/dev/null | paste -sd. -
}
prefixes=()
IFS=: read -r -a from_env <<<"${CMAKE_PREFIX_PATH:-}"
for p in "${from_env[@]}"; do [ -n "$p" ] && prefixes+=("$p"); done
IFS=: read -r -a path_dirs <<<"$PATH"
for p in "${path_dirs[@]}"; do
  case "$p" in
    */bin | */sbin) prefixes+=("$(dirname "$p")") ;;
    ?*) prefixes+=("$p") ;;
  esac
done
prefixes+=(/usr/local /usr)

cutlass_inc=""
cutlass_util=""
if [ -n "${CUTLASS_ROOT:-}" ]; then
  [ -f "$CUTLASS_ROOT/include/$COLLECTIVE" ] ||
    die "CUTLASS_ROOT=$CUTLASS_ROOT holds no include/$COLLECTIVE: point it at a CUTLASS checkout or install (4.2), or unset it to use the pip wheel"
  cutlass_inc=$CUTLASS_ROOT/include
  for dir in "$CUTLASS_ROOT/tools/util/include" "$CUTLASS_ROOT/include"; do
    if [ -f "$dir/$UTIL" ]; then cutlass_util=$dir; break; fi
  done
  [ -n "$cutlass_util" ] ||
    die "CUTLASS_ROOT=$CUTLASS_ROOT holds no tools/util/include/$UTIL (nor include/$UTIL): weft needs CUTLASS's util headers too"
  say "CUTLASS $(cutlass_version "$cutlass_inc") from CUTLASS_ROOT=$CUTLASS_ROOT (no download)"
elif [ -f "$DEPS/cutlass/include/$COLLECTIVE" ] && [ -f "$DEPS/cutlass/util/include/$UTIL" ]; then
  cutlass_inc=$DEPS/cutlass/include
  cutlass_util=$DEPS/cutlass/util/include
else
  for p in "${prefixes[@]}"; do
    if [ -f "$p/include/$COLLECTIVE" ] && [ -f "$p/include/$UTIL" ]; then
      v=$(cutlass_version "$p/include")
      if version_ge "${v:-0}" 4.2; then
        cutlass_inc=$p/include
        cutlass_util=$p/include
        say "CUTLASS $v installed in $p/include (no download)"
      else
        say "CUTLASS ${v:-of unknown version} in $p/include is older than 4.2, which weft is built with; fetching 4.2 into $DEPS/cutlass (CMake prefers it)"
      fi
      break
    fi
  done
fi
if [ -z "$cutlass_inc" ]; then
  whl=$(wheel "nvidia-cutlass==$CUTLASS_WHEEL_VERSION" "nvidia_cutlass-$CUTLASS_WHEEL_VERSION-py3-none-any.whl" \
        "nvidia_cutlass-$CUTLASS_WHEEL_VERSION-py3-none-any.whl")
  command -v python3 >/dev/null || die "python3 is needed to unpack $whl"
  python3 - "$DEPS" "$whl" <<'PY'
import os, shutil, sys, zipfile
deps, whl = sys.argv[1], sys.argv[2]
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
  cutlass_inc=$DEPS/cutlass/include
  cutlass_util=$DEPS/cutlass/util/include
  [ -f "$cutlass_inc/$COLLECTIVE" ] && [ -f "$cutlass_util/$UTIL" ] ||
    die "$whl did not hold CUTLASS's headers where expected (cutlass_library/source/include)"
  say "CUTLASS $(cutlass_version "$cutlass_inc") unpacked into $DEPS/cutlass"
fi
v=$(cutlass_version "$cutlass_inc")
if ! version_ge "${v:-0}" 4.2; then
  say "warning: CUTLASS ${v:-of unknown version} in $cutlass_inc; weft is built and tested with 4.2 and may not compile with older versions"
fi

# ---- the Python package's build backend: wheels in .deps/wheels -------------------
# `pip install --no-build-isolation .` (scripts/test.sh, the GPU machines,
# which reach no registry) needs scikit-build-core and its two dependencies in
# the installing Python; they are pure-Python wheels kept here, so that
# `pip install --no-index --find-links .deps/wheels scikit-build-core` works
# offline. The C++ build does not need them: a failed download only warns.
PY_BUILD_WHEELS=("scikit_build_core-1.1.2-*.whl scikit-build-core==1.1.2" "packaging-26.4-*.whl packaging==26.4"
                 "pathspec-1.1.1-*.whl pathspec==1.1.1")
if command -v python3 >/dev/null; then
  for entry in "${PY_BUILD_WHEELS[@]}"; do
    read -r glob req <<<"$entry"
    if ! ls "$WHEELS"/$glob >/dev/null 2>&1; then
      mkdir -p "$WHEELS"
      python3 -m pip download -q --no-deps --only-binary=:all: --retries 1 --timeout 20 -d "$WHEELS" "$req" >/dev/null 2>&1 ||
        say "warning: could not download $req into $WHEELS (offline?): the Python package's offline install needs it"
    fi
  done
fi

# ---- NVSHMEM (optional): the NVSHMEM heap backend -------------------------------------
# The places cmake/WeftFindNvshmem.cmake looks, in its order: NVSHMEM_HOME,
# .deps-nvshmem, python3's wheel (torch's), the system. WEFT_NVSHMEM=OFF skips
# it; =ON (CI) fails if it cannot be had; otherwise a failed download only warns
# and weft builds without the backend.
nvshmem_has() { [ -f "$1/include/host/nvshmemx_api.h" ] && { [ -f "$1/lib/libnvshmem_host.so.3" ] || [ -f "$1/lib64/libnvshmem_host.so.3" ]; }; }
NVDEPS=.deps-nvshmem
nvshmem_mode=$(echo "${WEFT_NVSHMEM:-AUTO}" | tr '[:lower:]' '[:upper:]')
nvshmem_note="NVSHMEM skipped (WEFT_NVSHMEM=OFF)"
if [ "$nvshmem_mode" != OFF ]; then
  nvshmem_dir=""
  if [ -n "${NVSHMEM_HOME:-}" ]; then
    nvshmem_has "$NVSHMEM_HOME" && nvshmem_dir=$NVSHMEM_HOME ||
      say "note: NVSHMEM_HOME=$NVSHMEM_HOME holds no include/host/nvshmemx_api.h and lib/libnvshmem_host.so.3; looking elsewhere"
  fi
  if [ -z "$nvshmem_dir" ] && nvshmem_has "$NVDEPS"; then nvshmem_dir=$NVDEPS; fi
  if [ -z "$nvshmem_dir" ] && command -v python3 >/dev/null; then
    wheel_dir=$(python3 -c "import nvidia.nvshmem as m; print(list(m.__path__)[0])" 2>/dev/null || true)
    if [ -n "$wheel_dir" ] && nvshmem_has "$wheel_dir"; then nvshmem_dir=$wheel_dir; fi
  fi
  if [ -z "$nvshmem_dir" ]; then
    if [ "$nvshmem_mode" = ON ]; then
      whl=$(WHEELS=$NVDEPS/wheels wheel "nvidia-nvshmem-cu13==$NVSHMEM_WHEEL_VERSION" "nvidia_nvshmem_cu13-$NVSHMEM_WHEEL_VERSION-*_$arch.whl" \
            "nvidia_nvshmem_cu13-$NVSHMEM_WHEEL_VERSION-py3-none-manylinux2014_$arch.manylinux_2_17_$arch.whl")
    else
      whl=$( (WHEELS=$NVDEPS/wheels wheel "nvidia-nvshmem-cu13==$NVSHMEM_WHEEL_VERSION" "nvidia_nvshmem_cu13-$NVSHMEM_WHEEL_VERSION-*_$arch.whl" \
              "nvidia_nvshmem_cu13-$NVSHMEM_WHEEL_VERSION-py3-none-manylinux2014_$arch.manylinux_2_17_$arch.whl") || true)
    fi
    if [ -n "$whl" ] && command -v python3 >/dev/null; then
      # Headers and the host, bootstrap and transport libraries; not the 31 MB LLVM bitcode.
      python3 - "$NVDEPS" "$whl" <<'PY'
import os, shutil, sys, zipfile
dest, whl = sys.argv[1], sys.argv[2]
prefix = "nvidia/nvshmem/"
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if n.startswith(prefix) and not n.endswith("/") and not n.endswith(".bc"):
            target = os.path.join(dest, n[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(n) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
PY
      nvshmem_has "$NVDEPS" || die "$whl did not hold NVSHMEM's headers and host library where expected (nvidia/nvshmem/)"
      nvshmem_dir=$NVDEPS
      say "NVSHMEM $NVSHMEM_WHEEL_VERSION unpacked into $NVDEPS"
    else
      say "warning: NVSHMEM not found and not fetched: weft builds without the NVSHMEM heap backend (WEFT_NVSHMEM=ON demands it)"
    fi
  fi
  nvshmem_note="NVSHMEM ${nvshmem_dir:+in $nvshmem_dir}"
  [ -n "$nvshmem_dir" ] || nvshmem_note="no NVSHMEM"
fi

say "ok: CMake $cmake_version, CUDA $cuda_version ($nvcc), nvml.h in $(dirname "$nvml_h"), CUTLASS ${v:-?} in $cutlass_inc, $nvshmem_note"
