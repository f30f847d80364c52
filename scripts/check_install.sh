#!/usr/bin/env bash
# Checks weft as a dependency, the way a program of its own uses it:
#   1. installs the build (${WEFT_BUILD_DIR:-build}) into a temporary prefix
#      (cmake --install): libweft.a, the headers, weftrun, the CMake package;
#   2. copies examples/consumer out of the tree, configures it against that
#      prefix alone (find_package(weft)) and builds it;
#   3. runs it: with weftrun on every GPU when nvidia-smi lists some; else once
#      alone, where it must start (its libraries resolve) and stop with a plain
#      message and a non-zero exit, not crash.
# Needs a finished build (scripts/build.sh); compiles nothing of weft itself.
# Takes about half a minute on 2 cores, most of it CMake's CUDA checks and
# compiling the example. Exit status 0 when every step worked.
# WEFT_KEEP_CHECK=1 keeps the temporary directory for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${WEFT_BUILD_DIR:-build}
export PATH="${CUDA_HOME:+$CUDA_HOME/bin:}${CUDA_PATH:+$CUDA_PATH/bin:}$PATH:/usr/local/cuda/bin"

say() { echo "[check_install] $*"; }
die() { echo "[check_install] FAILED: $*" >&2; exit 1; }
t0=$SECONDS

[ -f "$BUILD/libweft.a" ] && [ -x "$BUILD/weftrun" ] ||
  die "no finished build in $BUILD (libweft.a, weftrun): run scripts/build.sh first"
grep -q weftTargets "$BUILD/cmake_install.cmake" 2>/dev/null ||
  die "$BUILD was configured before weft had install rules: run scripts/build.sh (it reconfigures) first"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/weft-check-install.XXXXXX")
if [ "${WEFT_KEEP_CHECK:-0}" = 1 ]; then
  say "keeping $WORK"
else
  trap 'rm -rf "$WORK"' EXIT
fi
PREFIX=$WORK/prefix

# ---- 1. install ---------------------------------------------------------------
say "1/3 cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log"; die "cmake --install $BUILD failed"; }
lib=$(find "$PREFIX" -name libweft.a | head -n 1)
config=$(find "$PREFIX" -name weftConfig.cmake | head -n 1)
[ -n "$lib" ] || die "no libweft.a under $PREFIX"
[ -n "$config" ] || die "no weftConfig.cmake under $PREFIX"
for f in bin/weftrun include/weft/runtime/context.hpp include/weft/ops/all_reduce.hpp include/weft/device.cuh; do
  [ -e "$PREFIX/$f" ] || die "$PREFIX/$f was not installed"
done
say "    installed $(grep -c 'Installing:' "$WORK/install.log") files: ${lib#"$PREFIX"/}, include/weft/ ($(find "$PREFIX/include/weft" -type f | wc -l) headers), bin/weftrun, ${config#"$PREFIX"/}"

# ---- 2. configure and build the consumer against the prefix alone ------------
cp -r examples/consumer "$WORK/src"
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
say "2/3 configuring examples/consumer (copied to $WORK/src) with CMAKE_PREFIX_PATH=$PREFIX"
cmake -S "$WORK/src" -B "$WORK/consumer" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc)" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log"; die "configuring examples/consumer against $PREFIX failed"; }
weft_dir=$(sed -n 's/^weft_DIR:PATH=//p' "$WORK/consumer/CMakeCache.txt")
[ "$weft_dir" = "$(dirname "$config")" ] || die "find_package(weft) found $weft_dir, not the package in $PREFIX"
say "    find_package(weft) used $weft_dir"
say "    building weft_consumer"
cmake --build "$WORK/consumer" ||
  die "building examples/consumer against $PREFIX failed (the output above says why)"
[ -x "$WORK/consumer/weft_consumer" ] || die "no weft_consumer was built"

# ---- 3. run it --------------------------------------------------------------
gpus=0
if command -v nvidia-smi >/dev/null && listing=$(timeout 20 nvidia-smi -L 2>/dev/null); then
  gpus=$(grep -c '^GPU ' <<<"$listing" || true)
fi
if [ "$gpus" -gt 0 ]; then
  say "3/3 running weftrun -n $gpus -- weft_consumer"
  "$PREFIX/bin/weftrun" -n "$gpus" --timeout 120 -- "$WORK/consumer/weft_consumer" ||
    die "weft_consumer failed on $gpus GPU(s)"
else
  say "3/3 no GPU here (nvidia-smi lists none): running weft_consumer alone, which must stop with a plain message"
  rc=0
  timeout 60 "$WORK/consumer/weft_consumer" >"$WORK/run.log" 2>&1 || rc=$?
  sed 's/^/    | /' "$WORK/run.log"
  if [ "$rc" -eq 0 ]; then
    die "weft_consumer reported success without a GPU"
  elif [ "$rc" -eq 124 ] || [ "$rc" -gt 128 ]; then
    die "weft_consumer did not stop cleanly without a GPU (exit status $rc)"
  elif ! grep -q '^weft_consumer: ' "$WORK/run.log"; then
    die "weft_consumer exited with status $rc but without its error message"
  fi
  say "    it stopped with exit status $rc and its message, as it should without a GPU"
fi
say "ok: weft installs, and a program builds against the installed package ($((SECONDS - t0)) s)"
