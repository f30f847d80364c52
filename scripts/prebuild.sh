#!/usr/bin/env bash
# Builds weft's GPU programs on a machine without a GPU and packs them for a
# GPU machine, so that a lent GPU's minutes go to tests rather than to the
# compiler (every kernel takes 259 s of a 16-core GPU machine, CI's subset
# about 170 s, against a device call's 600 s). The code is sm_90a machine
# code either way (WEFT_CUDA_GENCODE); nothing here needs a GPU.
#
#   bash scripts/prebuild.sh [BUILD_DIR]   build (default build-prebuilt) and pack
#   bash scripts/prebuild.sh --stamp       print the hash of the sources a pack must match
#
# WEFT_CMAKE_ARGS adds configure settings (default -DWEFT_GEMM_KERNELS=all), to a
# new build folder or, where given, to an existing one.
# Writes .carry/prebuilt.tar.xz: the GPU test programs, weftrun, weft-info,
# weft-bench, the examples, libweft.a (the python stage builds its extension
# on it: WEFT_PREBUILT_LIBWEFT) and CMakeCache.txt (gpu_tests.sh reads its
# kernel table), with SOURCE_STAMP, the hash of the sources they were built
# from. Carry it beside .deps (device tool: carry [".deps", ".carry"]):
# scripts/gpu_session.sh's build stage unpacks it where the stamp matches the
# tree it runs in and the programs start there, and builds as usual otherwise
# (another image's system libraries can refuse a binary built here).
set -euo pipefail
cd "$(dirname "$0")/.."

# What the programs are built from: every source, CMake and test file, by
# content. Docs and scripts do not enter.
source_stamp() {
  find CMakeLists.txt cmake include src tests tools examples python -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
if [ "${1:-}" = "--stamp" ]; then source_stamp; exit 0; fi

BUILD=${1:-build-prebuilt}
PACK=.carry/prebuilt.tar.xz
# The device tool carries 64 MiB in all; .deps takes about 36 of them.
LIMIT_MB=${WEFT_PREBUILT_LIMIT_MB:-27}

[ -d .deps ] || { echo "prebuild.sh: no .deps/: run bash scripts/setup.sh first" >&2; exit 1; }
# A new folder is configured with WEFT_CMAKE_ARGS (default: every kernel); an
# existing one keeps its settings unless WEFT_CMAKE_ARGS is given, which then
# applies to it too (a cached WEFT_GEMM_KERNELS would otherwise win silently).
if [ ! -f "$BUILD/CMakeCache.txt" ] || [ -n "${WEFT_CMAKE_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${WEFT_CMAKE_ARGS:--DWEFT_GEMM_KERNELS=all}
fi
# Name the kernel table the pack will hold: scripts/gpu_tests.sh refuses the suite on the CI subset.
echo "prebuild.sh: $(grep -E '^WEFT_(GEMM|GROUPED)_KERNELS:STRING=' "$BUILD/CMakeCache.txt" | tr '\n' ' ')"
stamp=$(source_stamp)
# weft_internode_tests exists where NVSHMEM and its device library were found.
mapfile -t optional < <(ninja -C "$BUILD" -t targets all | grep -oE '^(example_[A-Za-z0-9_]+|weft_internode_tests):' |
                        tr -d : | sort -u)
cmake --build "$BUILD" -j "$(nproc)" --target weftrun weft-info weft-bench weft_gpu_tests weft_test_rank "${optional[@]}"
[ "$(source_stamp)" = "$stamp" ] || { echo "prebuild.sh: the sources changed during the build; run it again" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests"
echo "$stamp" >"$stage/SOURCE_STAMP"
cp "$BUILD/CMakeCache.txt" "$BUILD/libweft.a" "$stage/"
cp "$BUILD/weftrun" "$BUILD/weft-info" "$BUILD/weft-bench" "$BUILD"/example_* "$stage/"
for f in weft_gpu_tests weft_test_rank weft_internode_tests; do
  [ -f "$BUILD/tests/$f" ] && cp "$BUILD/tests/$f" "$stage/tests/"
done
# Symbols stay (a crash's frames name functions); the debug sections go.
find "$stage" -type f -perm -u+x -exec strip --strip-debug {} +
mkdir -p .carry
tar -C "$stage" -cJf "$PACK" .
size_mb=$(( $(stat -c %s "$PACK") / 1048576 ))
echo "prebuild.sh: $PACK ($size_mb MiB), sources $stamp, $(grep -E '^WEFT_GEMM_KERNELS:' "$BUILD/CMakeCache.txt")"
if [ "$size_mb" -gt "$LIMIT_MB" ]; then
  echo "prebuild.sh: $PACK is over $LIMIT_MB MiB: with .deps it would pass the device tool's 64 MiB" >&2
  exit 1
fi
