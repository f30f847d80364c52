#!/usr/bin/env bash
# The Python package's tests (scripts/test.sh runs this after the C++ build):
#   1. a Python with torch 2.11: WEFT_PYTHON_EXE if set, else python3 where it imports torch 2.11 (the GPU
#      machines' image), else the venv .venv-torch/, made here and given
#      torch==2.11.0 from PyPI when it lacks it;
#   2. the package built by that Python's pip against the library just built
#      (WEFT_PREBUILT_LIBWEFT: no second compile of the kernels) and installed
#      into BUILD_DIR/python-site, its build backend (scikit-build-core) from
#      .deps/wheels without network;
#   3. pytest tests/python: the CPU tests always, the GPU tests as one rank
#      where there is a GPU (they skip themselves where there is none).
# Usage: bash scripts/python_tests.sh [BUILD_DIR] [JUNIT_XML]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-${WEFT_BUILD_DIR:-build}}
JUNIT=${2:-$BUILD/python-junit.xml}
TORCH_VERSION=2.11.0
say() { echo "[python] $*"; }
export PATH="${CUDA_HOME:+$CUDA_HOME/bin:}$PATH:/usr/local/cuda/bin"  # nvcc, as scripts/build.sh finds it

has_torch() { "$1" -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; }
if [ -n "${WEFT_PYTHON_EXE:-}" ]; then
  PY=$WEFT_PYTHON_EXE
elif has_torch python3; then
  PY=python3
else
  VENV=.venv-torch
  [ -x "$VENV/bin/python" ] || { say "making $VENV (a venv for torch $TORCH_VERSION)"; python3 -m venv "$VENV"; }
  PY=$VENV/bin/python
  if ! has_torch "$PY"; then
    say "installing torch==$TORCH_VERSION from PyPI into $VENV (a few minutes, once)"
    "$PY" -m pip install -q --upgrade pip >/dev/null
    "$PY" -m pip install -q "torch==$TORCH_VERSION" pytest numpy
  fi
fi
"$PY" -c 'import pytest' 2>/dev/null || "$PY" -m pip install -q pytest
say "python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)'))"

# The build backend, from the wheels scripts/setup.sh keeps in .deps/wheels.
if ! "$PY" -c 'import scikit_build_core' 2>/dev/null; then
  "$PY" -m pip install -q --no-index --find-links .deps/wheels scikit-build-core ||
    { say "scikit-build-core is not installed and not in .deps/wheels: run scripts/setup.sh with network once"; exit 1; }
fi

[ -f "$BUILD/libweft.a" ] || { say "no $BUILD/libweft.a: build the library first (bash scripts/build.sh)"; exit 1; }
TARGET=$BUILD/python-site
rm -rf "$TARGET"
t0=$SECONDS
say "building and installing the package into $TARGET (against $BUILD/libweft.a)"
"$PY" -m pip install -q --no-build-isolation --no-index --no-deps --target "$TARGET" \
  -C cmake.define.WEFT_PREBUILT_LIBWEFT="$PWD/$BUILD/libweft.a" -C build-dir="$BUILD/python" \
  ${WEFT_JOBS:+-C build.tool-args=-j$WEFT_JOBS} .
say "installed in $((SECONDS - t0)) s"

# From the repository root the installed package is the one imported (the sources are under python/).
PYTHONPATH="$PWD/$TARGET${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider tests/python \
  --junitxml="$JUNIT" "${@:3}"
